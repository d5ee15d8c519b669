"""SparkSession for the jobs: local[*] when run directly, whatever spark-submit chose when run through it."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

# Big generated methods (wide validation and aggregation expressions) must still be JIT-compiled by HotSpot.
JIT_HUGE_METHODS = "-XX:-DontCompileHugeMethods"
# Settings every job relies on: UTC everywhere (dates, hours), partition values read as strings.
JOB_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # partitioned writes keep one open file per partition value instead of sorting every row by it first
    "spark.sql.optimizer.plannedWrite.enabled": "false",
    "spark.sql.maxConcurrentOutputFileWriters": "64",
    # joins whose shuffled partitions are small build a hash table instead of sorting both sides
    "spark.sql.adaptive.maxShuffledHashJoinLocalMapThreshold": "64MB",
    # percentile digests of a few hundred groups (roll-ups, latency) stay hash-aggregated instead of sorting the rows
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1024",
}


def under_spark_submit() -> bool:
    """True when this Python process was started by spark-submit (or a pyspark shell) that owns the master."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(app: str, master: str | None = None, driver_memory: str | None = None,
              shuffle_partitions: int | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """Start (or join) the session; never overrides a master that spark-submit passed in."""
    builder = SparkSession.builder.appName(app)
    if master is not None or not under_spark_submit():
        builder = builder.master(master or "local[*]")
        builder = builder.config("spark.driver.memory", driver_memory or "2g")
        builder = builder.config("spark.ui.showConsoleProgress", "true")
        builder = builder.config("spark.driver.extraJavaOptions", JIT_HUGE_METHODS)
    builder = builder.config("spark.executor.extraJavaOptions", JIT_HUGE_METHODS)
    for key, value in {**JOB_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    elif master is not None or not under_spark_submit():
        spark.conf.set("spark.sql.shuffle.partitions", str(max(8, 4 * spark.sparkContext.defaultParallelism)))
    for key, value in JOB_CONF.items():
        if not key.startswith("spark.sql.adaptive"):
            spark.conf.set(key, value)
    return spark
