"""An upload tree without any segment gives empty tables with their schema and a zero summary, never a stack trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
from chispa import assert_df_equality

from cloud_spark import jobs, report

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]
NOTHING = {"events": 0, "duplicates_removed": 0, "quarantined": {}}


def empty_summary(window_end_us: int | None, grace_us: int = 60_000_000) -> dict[str, Any]:
    """What summary.json says about an analysis window without a single event."""
    return {
        "window_end_us": window_end_us, "grace_us": grace_us, "pairs": 0,
        "fates": {f: 0 for f in ("acked", "delivered", "delivered_not_acked", "dropped", "expired", "lost",
                                 "pending")},
        "duplicated": 0, "e2e": {},
        "ordering": {"late": 0, "inversions": 0, "streams": 0, "reordered_streams": 0, "max_displacement": 0},
        "latency": {}, "clocks": {"boots": 0, "stepped": 0, "never_synced": 0, "unsynced_events": 0},
        "incidents": {}, "ingress_drops": {}, "fleets": {}, "ingest": NOTHING,
    }


def test_no_segments_at_all_gives_empty_tables_and_a_zero_summary(spark: Any, tmp_path: Path) -> None:
    src, out = tmp_path / "segments", tmp_path / "tables"
    src.mkdir()
    stats = jobs.ingest_job(spark, str(src), str(out))
    assert stats == NOTHING
    events = jobs.read_events(spark, str(out)).select("event_id", "kind", "ts_wall_us", "copies", "fleet", "date")
    assert_df_equality(events, spark.createDataFrame(
        [], "event_id string, kind string, ts_wall_us long, copies long, fleet string, date string"),
        ignore_nullable=True)
    summary = jobs.analyze_job(spark, str(out), ingest_summary=stats)
    assert summary == empty_summary(None)
    assert json.loads((out / "summary.json").read_text()) == summary
    rollup = spark.read.parquet(f"{out}/rollup_fleet").select("fleet", "pairs", "lost", "late")
    assert_df_equality(rollup, spark.createDataFrame([], "fleet string, pairs long, lost long, late long"),
                       ignore_nullable=True)
    streams = spark.read.parquet(f"{out}/streams").select("publisher", "subscriber", "late", "inversions")
    assert_df_equality(streams, spark.createDataFrame(
        [], "publisher string, subscriber string, late long, inversions long"), ignore_nullable=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", module="cloud_spark")  # an empty report draws without complaints
        page = report.render(spark, str(out), str(tmp_path / "report")).read_text()
    assert "0 (message, subscriber) pairs; 0 lost" in page


def test_run_over_only_non_segment_files_exits_0_with_a_zero_summary(tmp_path: Path) -> None:
    src, out = tmp_path / "segments", tmp_path / "tables"
    device = src / "fleet=f1" / "date=2026-11-20" / "device=d1"
    device.mkdir(parents=True)
    (src / "README.txt").write_text("uploads land here\n")
    (device / "upload.log").write_text("2026-11-20 nothing to send\n")
    (device / "_SUCCESS").write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "cloud_spark", "--master", "local[1]", "--driver-memory", "768m",
                           "--shuffle-partitions", "2", "run", str(src), str(out), "--window-end-us", "1000"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Exception" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"ingest: no segment (*.parquet, *.jsonl.gz) under {src}" in done.stderr
    assert json.loads(done.stdout) == empty_summary(1000)
    assert (out / "report" / "index.html").exists()
