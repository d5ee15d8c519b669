"""Bounded chaos runs against real broker processes: zero lost acknowledged messages, no per-publisher reordering for
persistent subscribers, no QoS2 duplicate; and the Spark job's loss / order report agrees with the checker.

Failing runs keep their directories (node logs, client records, receipts, nemesis log) under tests/chaos/out/.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.checker import check
from tests.chaos.history import read_history
from tests.chaos.nodes import ClusterNodes
from tests.chaos.run import OUT, RunConfig, Totals, run_many, run_once
from tests.harness.netns import netns_unavailable
from tests.support.broker import ours_unavailable

CI_RUNS = 10
CI_TRAFFIC_S = 20.0


@pytest.fixture(autouse=True)
def _broker_runnable() -> None:
    reason = ours_unavailable()
    if reason:
        pytest.skip(f"our broker is not runnable ({reason})")


def _report(totals: Totals, nodes: int) -> str:
    lines = [totals.line(nodes)]
    for o in totals.failed:
        lines.append(o.line())
        lines.append(f"  logs: {o.workdir}")
    return "\n".join(lines)


def _assert_guarantees(totals: Totals, nodes: int) -> None:
    """The issue's pass criteria over all runs, and evidence that the runs were not vacuous."""
    c = totals.counts
    report = _report(totals, nodes)
    assert c["acked"] > 100 * totals.runs, f"too little traffic to prove anything\n{report}"
    assert sum(totals.faults.values()) >= totals.runs, f"the nemesis hardly acted\n{report}"
    assert c["lost"] == 0, f"lost acknowledged messages\n{report}"
    assert c["reordered"] == 0, f"per-publisher reordering for persistent subscribers\n{report}"
    assert c["unexpected"] == 0, f"deliveries of messages never sent\n{report}"
    assert c["dup_qos2"] == 0, f"QoS2 duplicates\n{report}"
    assert not totals.failed, f"runs failed (crash, harness error)\n{report}"


@pytest.mark.slow
def test_single_node_chaos_runs() -> None:
    """10 runs of 20 s traffic against one node with kill -9 / restart and SIGSTOP / SIGCONT.

    Found and since fixed: QoS2 duplicates after kill -9 (routing before the packet id commit, PUBREL before the
    RELEASED commit) and a silent loss when PUBACKs arrived together with DISCONNECT.
    """
    configs = [RunConfig(nodes=1, traffic_s=CI_TRAFFIC_S, drain_s=30.0, seed=seed) for seed in range(1, CI_RUNS + 1)]
    totals = run_many(configs, OUT)
    print(totals.line(1))
    _assert_guarantees(totals, 1)


# -- Spark agreement -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.spark
def test_spark_report_agrees_with_checker(tmp_path: Path) -> None:
    """One run (kill -9 and SIGSTOP) with broker delivery logs on, plus an injected client-side loss and duplicate."""
    pytest.importorskip("pyspark")
    from cloud_spark.session import get_spark
    from tests.chaos.spark_agreement import (
        broker_logged,
        disagreements,
        inject_client_faults,
        spark_view,
        stage_segments,
        unjudged,
    )

    run_dir = tmp_path / "run"
    config = RunConfig(nodes=1, traffic_s=10.0, drain_s=20.0, seed=4242, deliverylog=True, ops=("kill", "stop"))
    outcome = run_once(config, run_dir)
    assert not outcome.problems, outcome.line()
    history = list(read_history(run_dir / "clients" / "history.jsonl"))
    logged = broker_logged(run_dir)
    got = {(e["pub"], e["seq"]) for e in history if e["e"] == "recv" and e["c"] == "sub0" and e["app"]}
    lose, duplicate = random.Random(4242).sample(sorted(got & logged), 2)
    before = check(history)
    inject_client_faults(run_dir, "sub0", lose, duplicate)
    result = check(read_history(run_dir / "clients" / "history.jsonl"))
    assert (*lose, "sub0") in result.keys["lost"] and result.counts["lost"] == before.counts["lost"] + 1
    assert (*duplicate, "sub0") in result.keys["duplicated"]
    assert stage_segments(run_dir, tmp_path / "stage") >= 8  # 7 clients' receipts + the node's log

    spark = get_spark("chaos-agreement", "local[2]", driver_memory="1g", shuffle_partitions=2,
                      conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
    try:
        view = spark_view(spark, tmp_path / "stage", tmp_path / "spark")
    finally:
        spark.stop()
    assert view.keys["received"], "Spark judged no delivery end to end: receipts and broker logs did not join"
    assert (*lose, "sub0") in view.keys["lost"] and (*duplicate, "sub0") in view.keys["duplicated"]
    assert disagreements(result, view) == [], view.summary
    print(f"agreement on {len(view.keys['judged'])} (message, subscriber) keys; checker {result.line()}; "
          f"{len(unjudged(result, view))} keys not judgeable by Spark (broker log lost at kill -9)")


# -- multi-node ------------------------------------------------------------------------------------------------


def _all_running(output: str, n: int) -> bool:
    """Whether a `cluster show --json` output lists n nodes, every one running (or itself)."""
    try:
        members = json.loads(output).get("members", [])
    except ValueError:
        return False
    return len(members) == n and all(m.get("state") in ("self", "running") for m in members)


@functools.cache
def cluster_unusable() -> str | None:
    """Why multi-node chaos cannot run yet: start 3 nodes and ask `appliance cluster show` on each."""
    reason = netns_unavailable() or ours_unavailable()
    if reason:
        return reason
    workdir = Path(tempfile.mkdtemp(prefix="chaos-probe-"))
    nodes = None
    try:
        nodes = ClusterNodes(workdir, 3, deliverylog=False)
        shown = ""
        for _ in range(30):
            outputs = [nodes.show(i) for i in range(3)]
            bad = [o for o in outputs if o.returncode != 0]
            if bad:
                return f"`appliance cluster show` fails: {(bad[0].stderr or bad[0].stdout).strip()[-300:]}"
            shown = outputs[0].stdout
            if all(_all_running(o.stdout, 3) for o in outputs):
                return None
            time.sleep(1)
        return f"3 nodes did not all show each other as running within 30 s: {shown[-500:]}"
    except Exception as exc:  # the cluster not starting is exactly what this probe reports
        return f"3 clustered nodes do not start: {exc!r}"[:600]
    finally:
        if nodes is not None:
            nodes.shutdown()
            nodes.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def cluster_ready() -> Iterator[None]:
    reason = cluster_unusable()
    if reason:
        pytest.skip(f"multi-node chaos needs a usable cluster: {reason}")
    yield


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.parametrize("n", [3])
def test_cluster_chaos_runs(cluster_ready: None, n: int) -> None:
    """Runs against n clustered nodes with kills, stops, partitions and isolation of random nodes: zero lost
    acknowledged messages, zero QoS2 duplicates, zero per-publisher reorderings (the issue's CI criteria)."""
    configs = [RunConfig(nodes=n, traffic_s=CI_TRAFFIC_S, drain_s=40.0, seed=100 + s) for s in range(4)]
    totals = run_many(configs, OUT)
    print(totals.line(n))
    _assert_guarantees(totals, n)
