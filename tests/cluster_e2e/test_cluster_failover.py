"""Failover regressions found by the chaos harness (issue 4), each a scripted scenario on real nodes in namespaces:
an isolated owner refuses what only its disk would keep; a node that cannot tell whether the
owner is alive refuses to fork the session; a QoS2 delivery in flight resumes under its packet id with DUP."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.harness.netns import wait_until

from .nodes import WAIT, Cluster, lines

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def step(cluster: Cluster, i: int, client_id: str, topic: str, *args: str) -> list[dict[str, Any]]:
    """Run tests.cluster_e2e.step_client against node i (from its namespace); its JSON events."""
    out = cluster.lab.exec(i, sys.executable, "-m", "tests.cluster_e2e.step_client", cluster.lab.ip(i), client_id,
                           topic, *args, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def isolate(cluster: Cluster, i: int) -> None:
    """Cut node i from every other node (clients in its namespace still reach it) and wait until all notice."""
    others = [j for j in range(cluster.n) if j != i]
    for j in others:
        cluster.lab.partition(i, j)
    wait_until(lambda: cluster.running_peers(i) == set(), WAIT, f"{cluster.name(i)} sees nobody")
    for j in others:
        wait_until(lambda j=j: cluster.name(i) not in cluster.running_peers(j), WAIT, f"{cluster.name(j)} split")


def publish_v5(cluster: Cluster, i: int, client_id: str, topic: str, *messages: str) -> list[dict[str, Any]]:
    """Publish PID:PAYLOAD messages at QoS1 with tests.cluster_e2e.pub_client on node i; its JSON events."""
    out = cluster.lab.exec(i, sys.executable, "-m", "tests.cluster_e2e.pub_client", cluster.lab.ip(i), client_id,
                           topic, *messages, "--qos", "1", check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_an_isolated_owner_refuses_what_only_its_disk_would_keep(netns_lab) -> None:
    """Chaos findings: an isolated owner acknowledged messages on its disk only (under_replicated = accept) and
    handed them to the session resumed elsewhere after the heal, late (seed 30625: behind newer ones, once the
    owner had been killed before handing them over). A minority side now refuses them (PUBACK 0x83); the client
    publishes them again after the heal, and the resumed session gets everything once, in publishing order."""
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    cluster.sub(1, "f/#", "s", 1, timeout=1)  # persistent QoS1 session owned by B, replicated to A or C
    wait_until(lambda: cluster.owner(0, "s") == "nb" and cluster.owner(2, "s") == "nb", WAIT, "claim replicated")
    cluster.pub(0, "f/a", ["a1", "a2"], client_id="pa")  # queued on B and its replica
    isolate(cluster, 1)
    refused = publish_v5(cluster, 1, "pb", "f/b", "1:b1", "2:b2", "3:b3")  # only B's disk would hold them
    assert [(e["pid"], e["rc"]) for e in refused if "ack" in e] == [(1, 0x83), (2, 0x83), (3, 0x83)]
    sub = cluster.spawn_sub(0, "f/#", "s")  # the majority side resumes the session from the replica
    wait_until(lambda: cluster.owner(2, "s") == "na", WAIT, "session resumed on A")
    cluster.pub(0, "f/a", ["a3", "a4"], client_id="pa")
    wait_until(lambda: len(lines(sub)) >= 4, WAIT, "a1..a4 on A")
    cluster.lab.heal_all()
    cluster.wait_formed()
    again = publish_v5(cluster, 1, "pb", "f/b", "4:b1", "5:b2", "6:b3")  # published again after the heal
    assert [(e["pid"], e["rc"]) for e in again if "ack" in e] == [(4, 0), (5, 0), (6, 0)]
    cluster.pub(0, "f/a", ["end"], client_id="pa")
    wait_until(lambda: "end" in lines(sub), WAIT, "the last message")
    got = lines(sub)
    assert sorted(got) == sorted(["a1", "a2", "a3", "a4", "b1", "b2", "b3", "end"])  # each exactly once
    assert [m for m in got if m.startswith("a")] == ["a1", "a2", "a3", "a4"]
    assert [m for m in got if m.startswith("b")] == ["b1", "b2", "b3"]
    assert {cluster.owner(i, "s") for i in range(3)} == {"na"}
    assert cluster.crashes() == []


def test_a_node_that_cannot_tell_whether_the_owner_lives_refuses_to_fork_the_session(netns_lab) -> None:
    """Chaos finding: a subscriber reconnecting to a node cut from its session's owner resumed a stale copy there
    while the owner kept queueing for it. Now: 0x88 while the owner is alive behind a pair partition, or while the
    node is on a minority side; the client connecting to a node that reaches the owner gets everything."""
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    assert step(cluster, 1, "r", "g/#", "--qos", "1", "--count", "0")[1] == {"suback": [1]}  # owned by B
    wait_until(lambda: cluster.owner(0, "r") == "nb" and cluster.owner(2, "r") == "nb", WAIT, "claim replicated")
    cluster.pub(0, "g/x", ["g1", "g2"], client_id="pg")
    cluster.lab.partition(0, 1)  # only A-B: C still reaches both
    wait_until(lambda: cluster.running_peers(0) == {"nc"}, WAIT, "A cut from B")
    assert step(cluster, 0, "r", "g/#", "--qos", "1") == [{"connack": "CONNACK refused: 0x88"}]
    cluster.lab.partition(0, 2)  # A alone: a minority side
    wait_until(lambda: cluster.running_peers(0) == set(), WAIT, "A isolated")
    assert step(cluster, 0, "r", "g/#", "--qos", "1") == [{"connack": "CONNACK refused: 0x88"}]
    events = step(cluster, 2, "r", "g/#", "--qos", "1", "--count", "2")  # C takes the session over from B
    assert events[0] == {"connack": 0, "present": True}
    assert [e["payload"] for e in events[1:] if "payload" in e] == ["g1", "g2"]
    assert cluster.owner(1, "r") == "nc"
    cluster.lab.heal_all()
    cluster.wait_formed()
    assert step(cluster, 0, "r", "g/#", "--qos", "1", "--quiet", "1")[0] == {"connack": 0, "present": True}
    assert cluster.crashes() == []


def test_a_qos2_delivery_in_flight_resumes_under_its_packet_id_with_dup_after_the_owner_dies(netns_lab) -> None:
    """Chaos finding: the replica did not know a QoS2 PUBLISH had been sent, so the resumed session sent it again
    as a new message (new flow, DUP 0) and the client got it twice. Now the PUBLISH leaves only once the replica
    holds its packet id, and the resumed session resends it under that id with DUP [MQTT-4.3.3, MQTT-4.4.0-1]."""
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    assert step(cluster, 2, "q", "h/#", "--count", "0")[1] == {"suback": [2]}  # QoS2 session owned by C
    wait_until(lambda: cluster.owner(0, "q") == "nc" and cluster.owner(1, "q") == "nc", WAIT, "claim replicated")
    wait_until(lambda: cluster.status(0).get("replica_copies", 0) + cluster.status(1).get("replica_copies", 0) == 1,
               WAIT, "one replica copy")
    holder = cluster.lab.spawn(2, [sys.executable, "-m", "tests.cluster_e2e.step_client", cluster.lab.ip(2), "q",
                                   "h/#", "--count", "1", "--no-ack", "--quiet", "30"], name="q-hold-")
    wait_until(lambda: '"present": true' in holder.output(), WAIT, "subscriber connected to C")
    cluster.pub(0, "h/x", ["x1"], qos=2, client_id="px")
    wait_until(lambda: '"payload"' in holder.output(), WAIT, "x1 delivered, not acknowledged")
    first = [json.loads(line) for line in holder.output().splitlines() if '"payload"' in line]
    assert first == [{"payload": "x1", "pid": first[0]["pid"], "dup": False, "qos": 2}]
    cluster.kill(2)
    wait_until(lambda: cluster.running_peers(0) == {"nb"}, WAIT, "C down")
    events = step(cluster, 0, "q", "h/#", "--count", "1")
    assert events[0] == {"connack": 0, "present": True}
    assert {"payload": "x1", "pid": first[0]["pid"], "dup": True, "qos": 2} in events  # the same flow, resumed
    assert {"pubrel": first[0]["pid"]} in events
    again = step(cluster, 0, "q", "h/#", "--quiet", "1")
    assert [e for e in again if "payload" in e] == []  # completed: never delivered as a new message
    assert cluster.crashes() == []
