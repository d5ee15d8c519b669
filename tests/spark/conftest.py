"""One SparkSession (local[2], few shuffle partitions, no UI) shared by every Spark test in the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from cloud_spark.session import get_spark

    session = get_spark("cloud_spark-tests", "local[2]", driver_memory="1g", shuffle_partitions=2,
                        conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                              "spark.sql.adaptive.coalescePartitions.initialPartitionNum": "2",
                              "spark.default.parallelism": "2"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
