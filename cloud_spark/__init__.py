"""cloud_spark package."""
