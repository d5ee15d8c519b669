"""Spark pipeline benchmark."""
