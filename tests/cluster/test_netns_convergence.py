"""Three ClusterService processes in namespaces (real mDNS): writes on both sides of a partition converge on heal."""

from __future__ import annotations

import json
import sys

import pytest

from tests.harness.netns import Lab, NodeProcess, wait_until

pytestmark = pytest.mark.netns
WAIT = 40.0


def all_events(p: NodeProcess) -> list[dict]:
    return [json.loads(line) for line in p.output().splitlines() if line.startswith("{")]


def events(p: NodeProcess, ev: str) -> list[dict]:
    return [e for e in all_events(p) if e["ev"] == ev]


def linked(p: NodeProcess, peer: str) -> bool:
    """Whether p's latest up/down event for peer is up."""
    changes = [e["ev"] for e in all_events(p) if e["ev"] in ("up", "down") and e.get("peer") == peer]
    return bool(changes) and changes[-1] == "up"


def cmd(p: NodeProcess, **c: str) -> None:
    p.send(json.dumps(c))


def states(nodes: list[NodeProcess]) -> list[dict[str, str]]:
    """Ask each node to dump; return, per node, its latest space -> digest."""
    before = [len(events(p, "state")) for p in nodes]
    for p in nodes:
        cmd(p, op="dump")
    for p, n in zip(nodes, before, strict=True):
        wait_until(lambda p=p, n=n: len(events(p, "state")) >= n + 2, WAIT, "dump")
    return [{e["space"]: e["digest"] for e in events(p, "state")[-2:]} for p in nodes]


def test_partition_then_heal_converges_dvv_state_on_every_node(netns_lab) -> None:
    lab: Lab = netns_lab(3)
    names = ["na", "nb", "nc"]
    nodes = [lab.spawn(i, [sys.executable, "-m", "tests.cluster.service_node", "--cluster", "lab", "--node", n,
                           "--secret", "s"], name=n, stdin=True) for i, n in enumerate(names)]
    for p, me in zip(nodes, names, strict=True):
        wait_until(lambda p=p, me=me: all(linked(p, o) for o in names if o != me), WAIT, f"{me} linked to all")

    cmd(nodes[0], op="put", space="subs", key="c1", value="s1")
    cmd(nodes[1], op="put", space="retained", key="t/1", value="r1")
    wait_until(lambda: len({json.dumps(s, sort_keys=True) for s in states(nodes)}) == 1, WAIT, "initial convergence")

    # Split {na} | {nb, nc} with nftables; both sides write, including to the same keys.
    lab.partition(0, 1)
    lab.partition(0, 2)
    wait_until(lambda: not linked(nodes[0], "nb") and not linked(nodes[0], "nc"), WAIT, "split seen by na")
    cmd(nodes[0], op="put", space="subs", key="c1", value="s1-a")
    cmd(nodes[0], op="put", space="subs", key="c2", value="only-a")
    cmd(nodes[1], op="put", space="subs", key="c1", value="s1-b")
    cmd(nodes[2], op="delete", space="retained", key="t/1")
    cmd(nodes[2], op="put", space="retained", key="t/2", value="r2")
    wait_until(lambda: len({json.dumps(s, sort_keys=True) for s in states(nodes[1:])}) == 1, WAIT, "majority side")
    assert states(nodes)[0] != states(nodes)[1]  # the split really kept them apart

    lab.heal_all()
    wait_until(lambda: all(linked(nodes[0], o) for o in ("nb", "nc")), WAIT, "links back after heal")
    wait_until(lambda: len({json.dumps(s, sort_keys=True) for s in states(nodes)}) == 1, WAIT, "convergence after heal")
    live = [e["live"] for p in nodes for e in events(p, "state")[-2:] if e["space"] == "subs"]
    assert all(v == live[0] for v in live)
    assert live[0]["c2"] == "only-a"
    assert live[0]["c1"] in ("s1-a", "s1-b")  # concurrent siblings resolved identically everywhere
    retained = next(e["live"] for e in events(nodes[0], "state")[-2:] if e["space"] == "retained")
    assert retained == {"t/2": "r2"}
