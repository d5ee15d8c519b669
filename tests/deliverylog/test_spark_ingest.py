"""cloud_spark's ingest job reads real segments from our writer, Parquet and gzip JSON Lines, as uploaded."""

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from appliance.deliverylog import DeliveryLog, read_segments
from appliance.deliverylog.upload import main as upload

from .conftest import BOOT

pytestmark = pytest.mark.spark

COLUMNS = ("event_id", "schema_version", "fleet", "device", "node", "kind", "msg_id", "publisher", "publisher_seq",
           "topic", "qos", "retain", "payload_size", "subscriber", "filter", "dup", "attempt", "ts_wall_us",
           "ts_mono_us", "clock_synced")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] session (joins one another test module started; stops only the one it started)."""
    from pyspark.sql import SparkSession

    from cloud_spark.session import get_spark

    existing = SparkSession.getActiveSession()
    session = get_spark("deliverylog-ingest", "local[2]", driver_memory="1g", shuffle_partitions=2,
                        conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
    yield session
    if existing is None:
        session.stop()


def _device_log(directory, device: str, fmt: str, messages: int) -> None:
    """One node's log of QoS1 messages through the real writer, closed."""
    log = DeliveryLog(str(directory), fleet="fleet-1", device=device, node=f"node-{device}", firmware="1.2.3",
                      boot_id=BOOT, clock_synced=True, format=fmt, segment_bytes=4096, budget_bytes=1 << 30,
                      strict=True)
    log.emit("node_start")
    for i in range(messages):
        msg_id = f"{device}:{i}"
        log.emit("received", msg_id=msg_id, publisher="pub-1", publisher_packet_id=i % 65535 + 1, publisher_seq=i,
                 topic="plant/t", qos=1, retain=False, payload_size=64)
        log.emit("committed", msg_id=msg_id)
        log.emit("routed", msg_id=msg_id, subscriber="sub-1", filter="plant/#", qos=1)
        log.emit("delivered", msg_id=msg_id, subscriber="sub-1", dup=False, attempt=1)
        log.emit("acked", msg_id=msg_id, subscriber="sub-1")
    log.close()


def test_ingest_reads_parquet_and_jsonl_segments_from_the_writer(spark, tmp_path):
    from cloud_spark import jobs
    from cloud_spark.ingest import QUARANTINE_SCHEMA

    src = tmp_path / "bucket"
    expected = []
    for device, fmt in (("dev-parquet", "parquet"), ("dev-jsonl", "jsonl.gz")):
        log_dir = tmp_path / device
        _device_log(log_dir, device, fmt, 400)
        assert any(n.endswith("." + fmt) for n in os.listdir(log_dir))
        expected += read_segments(str(log_dir))
        assert upload(["--log-dir", str(log_dir), "--dest-dir", str(src)]) == 0  # Hive keys, as in the bucket
    assert list(src.rglob("*.parquet")) and list(src.rglob("*.jsonl.gz"))
    out = tmp_path / "tables"
    stats = jobs.ingest_job(spark, str(src), str(out), parquet=True)
    quarantined = spark.read.schema(QUARANTINE_SCHEMA).parquet(f"{out}/quarantine").count()
    assert quarantined == 0, stats
    events = spark.read.parquet(f"{out}/events")
    got = sorted(tuple(row) for row in events.select(*COLUMNS).collect())
    want = sorted(tuple(r[c] for c in COLUMNS) for r in expected)
    assert len(want) == 2 * (1 + 5 * 400)
    assert got == want
    assert events.where("copies != 1").count() == 0
