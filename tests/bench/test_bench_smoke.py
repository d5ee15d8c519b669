"""Behaviour of the benchmark harness (not a timing test): `bench.run --quick` against mosquitto yields every row."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import WORKLOADS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists(),
                    reason="mosquitto is installed by scripts/setup.sh")
def test_quick_run_against_mosquitto_prints_every_row_and_writes_json(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "bench.run", "--quick", "--brokers", "mosquitto", "--out",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [line.split() for line in res.stdout.splitlines()[2:] if line.strip()]
    shown = {(r[0], r[1], r[3]) for r in rows}  # workload, metric, broker
    for w in WORKLOADS.values():
        for metric, _unit in w.metrics:
            if metric in ("commit_batch_mean", "fsyncs_per_s", "broker_drops"):
                continue  # only our broker exports these counters
            assert (w.name, metric, "mosquitto") in shown, f"missing row {w.name}/{metric}"
    vs_mosq = {r[6] for r in rows if r[1] == "delivered_rate"}
    assert vs_mosq == {"1"}, "the baseline's ratio to itself must print as 1"
    for name in WORKLOADS:
        files = list(tmp_path.glob(f"{name}-*.json"))
        assert len(files) == 1
        data = json.loads(files[0].read_text())
        assert data["quick"] is True
        assert [r["broker"] for r in data["raw"]] == ["mosquitto"]
        assert "error" not in data["raw"][0], data["raw"][0]
    assert "error" not in res.stderr.lower(), res.stderr


def test_the_paired_delivery_log_benchmark_loads_both_nodes_in_turn_and_reports_the_log(tmp_path: Path) -> None:
    """bench.deliverylog_paired: every pair has both halves, the on node wrote Parquet, the summary is consistent."""
    out = tmp_path / "paired.json"
    res = subprocess.run([sys.executable, "-m", "bench.deliverylog_paired", "--pairs", "2", "--duration", "0.5",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    figures = json.loads(out.read_text())
    assert len(figures["ratios"]) == len(figures["rows"]) == 2
    for row in figures["rows"]:
        for side in ("off", "on"):
            assert row[side]["delivered"] > 0 and row[side]["rate"] > 0
        assert "thread deliverylog-writer" in row["on"] and "thread deliverylog-writer" not in row["off"]
    low, high = figures["pair_ratio_ci95"]
    assert min(figures["ratios"]) <= low <= figures["pair_ratio_median"] <= high <= max(figures["ratios"])
    assert 0 < figures["log_bytes_per_delivered_message"] < 200
    assert "median pair ratio" in res.stdout


def test_a_paired_benchmark_with_no_pairs_is_refused() -> None:
    res = subprocess.run([sys.executable, "-m", "bench.deliverylog_paired", "--pairs", "0"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and "--pairs" in res.stderr


def test_the_delivery_log_parts_benchmark_reports_every_sink_against_the_first(tmp_path: Path) -> None:
    """bench.deliverylog_parts: one line and one JSON entry per sink; the baseline's differences are zero."""
    out = tmp_path / "parts.json"
    sinks = "off,null,list,recorder,parquet,parquet@0.01,parquet-pure,parquet-pure@0.01"
    res = subprocess.run([sys.executable, "-m", "bench.deliverylog_parts", "--sinks", sinks, "--blocks", "2",
                          "--block-rounds", "1", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    figures = json.loads(out.read_text())
    assert list(figures["sinks"]) == sinks.split(",") and figures["baseline"] == "off"
    assert figures["sinks"]["off"]["main_minus_baseline_us"] == figures["sinks"]["off"]["total_minus_baseline_us"] == 0
    assert all(f["main_us"] > 0 for f in figures["sinks"].values())
    assert len(res.stdout.splitlines()) == len(sinks.split(","))
    for bad_sinks in ("off,bogus", "parquet@x", "parquet@0", "list@0.1", "", "off,off"):
        bad = subprocess.run([sys.executable, "-m", "bench.deliverylog_parts", "--sinks", bad_sinks], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "--sinks" in bad.stderr and "Traceback" not in bad.stderr, bad_sinks

