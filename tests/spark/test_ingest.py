"""Ingest job: schema enforcement, quarantine with a reason, dedupe of re-uploads, several schema versions, Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
import pyarrow as pa
import pyarrow.parquet as pq
from chispa import assert_df_equality
from pyspark.sql import types as T

from cloud_spark import jobs
from cloud_spark.cli import main
from cloud_spark.schema import V1, VERSIONS, VersionSpec
from tests.spark.fleetdata import T0, Node, write_segment

pytestmark = pytest.mark.spark

# A future producer version as cloud_spark would register it: one added field and one renamed field.
V2 = VersionSpec(
    2,
    T.StructType([f if f.name != "payload_size" else T.StructField("size_bytes", T.IntegerType(), True)
                  for f in V1.fields] + [T.StructField("tenant", T.StringType(), True)]),
    renames={"size_bytes": "payload_size"},
)
TWO_VERSIONS = {1: VERSIONS[1], 2: V2}


def good(n: Node, i: int, **kw: Any) -> dict[str, Any]:
    return n.event("received", T0 + i, msg_id=f"m{i}", publisher="p", publisher_seq=i, qos=1, payload_size=10, **kw)


@pytest.fixture(scope="module")
def ingested(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    src = tmp_path_factory.mktemp("segments")
    n = Node("n1", "d1")
    base, third = good(n, 1), None
    v2 = {**good(n, 2), "schema_version": 2, "tenant": "acme", "size_bytes": 99}
    del v2["payload_size"]
    lines: list[Any] = [
        base, v2, third := good(n, 3),
        json.dumps(good(n, 4))[:-9],  # truncated line
        {**good(n, 5), "schema_version": 7},
        {**good(n, 6), "ts_mono_us": "later"},
        {k: v for k, v in good(n, 7).items() if k != "device"},
        {**good(n, 8), "kind": "vanished"},
        {**good(n, 9), "source": "gateway"},
        {**n.event("delivered", T0 + 10, msg_id="m10")},  # no subscriber
        {**good(n, 11), "device": "d9"},
        {k: v for k, v in good(n, 12).items() if k != "schema_version"},
        {**good(n, 13), "schema_version": "1"},
        "[1, 2, 3]",
        "   ",
    ]
    write_segment(src, lines, name="seg-a")
    write_segment(src, [base, third], name="seg-a-reupload")  # the same records uploaded twice
    write_segment(src, [base], name="seg-a-again")  # and once more
    # a Parquet segment written the way a producer would (pyarrow), one record
    rec = good(n, 20)
    table = pa.Table.from_pylist([rec], schema=pa.schema(
        [(f.name, {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "boolean": pa.bool_()}[
            f.dataType.simpleString()]) for f in V1.fields]))
    pq.write_table(table, src / "fleet=f1" / "date=2026-11-20" / "device=d1" / "seg-p.parquet")
    out = tmp_path_factory.mktemp("tables")
    stats = jobs.ingest_job(spark, str(src), str(out), versions=TWO_VERSIONS, parquet=True)
    return out, stats


def test_rejects_go_to_quarantine_with_their_reason(spark: Any, ingested: tuple[Path, dict[str, Any]]) -> None:
    out, stats = ingested
    q = spark.read.parquet(f"{out}/quarantine").select("event_id", "reason", "path_device")
    expected = spark.createDataFrame([
        (None, "malformed JSON", "d1"),
        ("n1:n1-boot:5", "unknown schema_version: 7", "d1"),
        ("n1:n1-boot:6", "bad type for field: ts_mono_us", "d1"),
        ("n1:n1-boot:7", "missing required field: device", "d1"),
        ("n1:n1-boot:8", "unknown kind: vanished", "d1"),
        ("n1:n1-boot:9", "unknown source: gateway", "d1"),
        ("n1:n1-boot:10", "delivered without subscriber", "d1"),
        ("n1:n1-boot:11", "device differs from upload path", "d1"),
        ("n1:n1-boot:12", "missing required field: schema_version", "d1"),
        ("n1:n1-boot:13", "bad type for field: schema_version", "d1"),
        (None, "not a JSON object", "d1"),
        (None, "empty record", "d1"),
    ], "event_id string, reason string, path_device string")
    assert_df_equality(q, expected, ignore_row_order=True, ignore_nullable=True)
    raw = spark.read.parquet(f"{out}/quarantine").where("reason = 'malformed JSON'").first()
    assert raw["value"].startswith('{"event_id": "n1:n1-boot:4"') and raw["file"].endswith("seg-a.jsonl.gz")
    assert sum(stats["quarantined"].values()) == 12


def test_reuploads_are_deduplicated_by_event_id(spark: Any, ingested: tuple[Path, dict[str, Any]]) -> None:
    out, stats = ingested
    ev = spark.read.parquet(f"{out}/events").select("event_id", "copies")
    expected = spark.createDataFrame(
        [("n1:n1-boot:1", 3), ("n1:n1-boot:2", 1), ("n1:n1-boot:3", 2), ("n1:n1-boot:14", 1)],
        "event_id string, copies long")
    assert_df_equality(ev, expected, ignore_row_order=True, ignore_nullable=True)
    assert stats == {**stats, "events": 4, "duplicates_removed": 3}


def test_several_schema_versions_land_in_one_canonical_table(spark: Any,
                                                               ingested: tuple[Path, dict[str, Any]]) -> None:
    out, _ = ingested
    ev = spark.read.parquet(f"{out}/events").select("msg_id", "schema_version", "payload_size", "tenant", "fleet",
                                                     "date")
    day = "2026-11-20"
    expected = spark.createDataFrame([("m1", 1, 10, None, "f1", day), ("m2", 2, 99, "acme", "f1", day),
                                      ("m3", 1, 10, None, "f1", day), ("m20", 1, 10, None, "f1", day)],
                                     "msg_id string, schema_version int, payload_size int, tenant string, "
                                     "fleet string, date string")
    assert_df_equality(ev, expected, ignore_row_order=True, ignore_nullable=True, ignore_column_order=True)


def test_bad_command_lines_exit_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ingest"])
    assert exc.value.code == 2 and "src" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["teleport", "x"])
    assert exc.value.code == 2


def test_a_days_rejects_are_quarantined_when_other_days_are_already_ingested(spark: Any, tmp_path: Path) -> None:
    n = Node("n1", "d1")
    src, out = tmp_path / "segments", tmp_path / "tables"
    write_segment(src, [good(n, i) for i in range(1, 6)], date="2026-11-20")
    write_segment(src, [good(n, 6), {**good(n, 7), "kind": "vanished"}], date="2026-11-21")
    jobs.ingest_job(spark, str(src), str(out), dates=["2026-11-20"])
    stats = jobs.ingest_job(spark, str(src), str(out), dates=["2026-11-21"])  # the next day's run, same tables
    q = spark.read.parquet(f"{out}/quarantine").select("event_id", "reason", "path_date")
    expected = spark.createDataFrame([("n1:n1-boot:7", "unknown kind: vanished", "2026-11-21")],
                                     "event_id string, reason string, path_date string")
    assert_df_equality(q, expected, ignore_nullable=True)
    assert stats["events"] == 6 and stats["quarantined"] == {"unknown kind: vanished": 1}


def test_the_schema_the_jobs_read_events_with_is_the_one_ingest_writes(spark: Any,
                                                                       ingested: tuple[Path, dict[str, Any]]) -> None:
    out, _ = ingested
    written = spark.read.parquet(f"{out}/events").schema  # inferred from the files
    given = jobs.read_events(spark, str(out), TWO_VERSIONS).schema
    assert [(f.name, f.dataType) for f in given] == [(f.name, f.dataType) for f in written]
