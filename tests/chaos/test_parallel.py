"""`run_many(jobs=2)`: runs at once in worker processes, one outcome each, failing runs kept, passing ones deleted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.run import RunConfig, run_many
from tests.support.broker import ours_unavailable


def test_two_single_node_runs_at_once(tmp_path: Path) -> None:
    """Two short single-node runs with the nemesis on, two workers: both are counted with their own seed."""
    reason = ours_unavailable()
    if reason:
        pytest.skip(f"our broker is not runnable ({reason})")
    configs = [RunConfig(nodes=1, traffic_s=3.0, drain_s=5.0, seed=seed, ops=("kill", "stop")) for seed in (7, 8)]
    lines: list[str] = []
    totals = run_many(configs, tmp_path / "out", say=lines.append, jobs=2)
    runs = sorted(line for line in lines if line.startswith("chaos run "))
    assert [line.split()[2:4] for line in runs] == [["1", "seed=7"], ["2", "seed=8"]], lines
    assert totals.runs == 2 and not totals.interrupted
    assert totals.counts["acked"] > 50 and totals.counts["ok"] > 0, lines
    kept = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(kept) == len(totals.failed), (kept, lines)  # only failing runs keep a directory
