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


# Small enough for CI, big enough that every injected fault kind occurs several times.
SMALL_FLEET = dict(fleets=2, devices=3, messages=800, interval_us=20_000, grace_us=5_000_000, loss_rate=0.4,
                   dup_rate=0.4, reorder_rate=0.4, drop_rate=0.3, expire_rate=0.3, unacked_rate=0.3,
                   clock_jump_devices=2, peer_outages=2, node_restarts=1, seed=11)


@pytest.fixture(scope="session")
def generated(spark: object, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A generated fleet with injected faults (plus bad records and a re-upload), analysed once in local mode."""
    from cloud_spark import jobs
    from cloud_spark.generator import FleetSpec, generate, inject_upload_faults

    spec = FleetSpec(**SMALL_FLEET)  # type: ignore[arg-type]
    src = str(tmp_path_factory.mktemp("fleet"))
    manifest = generate(spec, src, processes=1)
    upload = inject_upload_faults(src, bad_per_reason=2, reuploads=1)
    out = str(tmp_path_factory.mktemp("local-run"))
    stats = jobs.ingest_job(spark, src, out)  # type: ignore[arg-type]
    summary = jobs.analyze_job(spark, out, grace_us=spec.grace_us, ingest_summary=stats)  # type: ignore[arg-type]
    return {"spec": spec, "src": src, "out": out, "manifest": manifest, "upload": upload, "summary": summary}
