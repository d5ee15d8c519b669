"""Spark pipeline tests (cloud_spark)."""
