"""Faults on real `appliance run` nodes in namespaces: SIGKILL with messages in transit, the seed scenario under
each policy, partition and heal, a duplicate client id during a partition, failover of a 10,000-message queue."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.harness.netns import wait_until

from .nodes import WAIT, Cluster, lines

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_sigkill_of_the_node_holding_in_transit_messages_loses_no_acknowledged_message(netns_lab) -> None:
    cluster = Cluster(netns_lab(2), 2)
    cluster.start()
    cluster.wait_formed()
    sub = cluster.spawn_sub(0, "t/#", "keeper")
    wait_until(lambda: cluster.owner(1, "keeper") == "na", WAIT, "subscription replicated")
    cluster.lab.signal(cluster.procs[0], signal.SIGSTOP)  # A cannot ack: B keeps what it forwards in transit
    wait_until(lambda: cluster.running_peers(1) == set(), WAIT, "B sees A down")
    sent = [f"m{n:03d}" for n in range(50)]
    cluster.pub(1, "t/x", sent, client_id="pub")  # returns once every PUBACK arrived (allow_publish = true)
    assert [m["in_transit"] for m in cluster.status(1)["members"] if m["node"] == "na"] == [50]
    cluster.kill(1)  # the only node holding the acknowledged messages dies
    cluster.lab.signal(cluster.procs[0], signal.SIGCONT)
    cluster.start(1)  # B resends its durable in-transit buffer to A
    wait_until(lambda: len(lines(sub)) >= 50, WAIT, "every acknowledged message delivered")
    assert lines(sub) == sent
    assert cluster.crashes() == []


SEED_CASES = {
    # replication_factor, allow_register -> what the subscriber receives, in order
    "replicated": ({"replication_factor": 2}, ["A", "B", "C", "D", "E"]),
    "r1-allow-register": ({"replication_factor": 1}, ["A", "D", "E", "B", "C"]),
    "r1-refuse-register": ({"replication_factor": 1, "allow_register": False}, ["A", "B", "C", "D", "E"]),
}


@pytest.mark.parametrize("case", list(SEED_CASES))
def test_seed_scenario(netns_lab, case: str) -> None:
    settings, expected = SEED_CASES[case]
    cluster = Cluster(netns_lab(3), 3, **settings)
    cluster.start()
    cluster.wait_formed()
    got = cluster.sub(2, "seed", "subscriber", 1, timeout=1)  # persistent session on C
    assert got == []
    wait_until(lambda: cluster.owner(1, "subscriber") == "nc", WAIT, "subscription replicated")
    cluster.pub(1, "seed", ["A"], client_id="publisher")
    received = cluster.sub(2, "seed", "subscriber", 1)
    cluster.pub(1, "seed", ["B", "C"], client_id="publisher")
    cluster.kill(2)
    wait_until(lambda: cluster.running_peers(0) == {"nb"}, WAIT, "A sees C down")
    if settings.get("allow_register", True):
        sub = cluster.spawn_sub(0, "seed", "subscriber")
        wait_until(lambda: cluster.owner(1, "subscriber") == "na", WAIT, "session resumed on A")
        cluster.pub(1, "seed", ["D", "E"], client_id="publisher")
        cluster.start(2)
        wait_until(lambda: len(lines(sub)) >= len(expected) - 1, WAIT, "all messages")
        received += lines(sub)
    else:
        refused = cluster.sub(0, "seed", "subscriber", 1, timeout=2)
        assert refused == []  # CONNACK 0x88 / rc 3 while the owner is unreachable
        cluster.pub(1, "seed", ["D", "E"], client_id="publisher")
        cluster.start(2)
        cluster.wait_formed()
        received += cluster.sub(0, "seed", "subscriber", 4)
    print(f"seed scenario {case}: {' '.join(received)}")
    assert received == expected
    assert cluster.crashes() == []


def test_partition_then_heal_converges_subscriptions_and_retained(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    cluster.lab.partition(0, 1)
    cluster.lab.partition(0, 2)
    wait_until(lambda: cluster.running_peers(0) == set() and cluster.running_peers(1) == {"nc"}, WAIT, "split")
    cluster.sub(0, "p/a", "side-a", 1, timeout=1)
    cluster.sub(1, "p/b", "side-b", 1, timeout=1)
    cluster.pub(0, "p/ra", ["ra"], retain=True, client_id="ra")
    cluster.pub(2, "p/rc", ["rc"], retain=True, client_id="rc")
    cluster.pub(0, "p/same", ["from-a"], retain=True, client_id="sa")
    cluster.pub(1, "p/same", ["from-b"], retain=True, client_id="sb")
    assert cluster.owner(0, "side-b") is None and cluster.owner(1, "side-a") is None
    cluster.lab.heal_all()
    cluster.wait_formed()

    def converged() -> bool:
        spaces = [cluster.status(i).get("spaces") for i in range(3)]
        return None not in spaces and all(s == spaces[0] for s in spaces)  # same DVV clocks and values everywhere

    wait_until(converged, 2 * WAIT, "identical DVV state on every node")
    for i in range(3):
        assert cluster.owner(i, "side-a") == "na" and cluster.owner(i, "side-b") == "nb"
        got = cluster.sub(i, "p/#", f"reader-{i}", 3, timeout=5, clean=True)
        assert sorted(got) == ["from-b", "ra", "rc"]  # the later concurrent retained write wins everywhere
    assert cluster.crashes() == []


def test_duplicate_client_id_during_a_partition_leaves_one_connection_after_heal(netns_lab) -> None:
    cluster = Cluster(netns_lab(2), 2)
    cluster.start()
    cluster.wait_formed()
    cluster.lab.partition(0, 1)
    wait_until(lambda: cluster.running_peers(0) == set() and cluster.running_peers(1) == set(), WAIT, "split")
    clients = [cluster.lab.spawn(i, [sys.executable, "-m", "tests.cluster_e2e.hold_client", cluster.lab.ip(i),
                                     "twin"], name=f"twin{i}-") for i in range(2)]
    for c in clients:
        wait_until(lambda c=c: "connected" in c.output(), WAIT, "twin connected")
    assert cluster.owner(0, "twin") == "na" and cluster.owner(1, "twin") == "nb"
    cluster.lab.heal(0, 1)
    cluster.wait_formed()
    wait_until(lambda: sum(1 for c in clients if c.alive()) == 1, WAIT, "one connection left")
    loser = next(c for c in clients if not c.alive())
    assert "disconnect 0x8e" in loser.output()
    winner = next(c for c in clients if c.alive())
    wait_until(lambda: {cluster.owner(i, "twin") for i in range(2)} == {cluster.name(winner.node)}, WAIT, "agree")
    assert cluster.crashes() == []


def test_owner_of_a_10000_message_queue_killed_client_resumes_elsewhere_with_all_in_order(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    cluster.sub(2, "q", "big", 1, timeout=1)  # persistent session owned by C
    wait_until(lambda: cluster.owner(0, "big") == "nc", WAIT, "session claimed")
    sent = [f"{n:05d}-" + "x" * 94 for n in range(10_000)]
    cluster.pub(0, "q", sent, client_id="loader")  # every PUBACK means owner + replica committed
    cluster.kill(2)
    wait_until(lambda: cluster.running_peers(0) == {"nb"}, WAIT, "C down")
    got = cluster.sub(1, "q", "big", 10_000, timeout=30)
    assert len(got) == 10_000 and got == sent
    assert cluster.crashes() == []


def test_replicas_are_rebuilt_after_a_node_dies_so_a_second_failure_loses_nothing(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    cluster.sub(0, "rr", "moved", 1, timeout=1)  # owned by A, replica on B or C
    wait_until(lambda: cluster.owner(1, "moved") == "na" and cluster.owner(2, "moved") == "na", WAIT, "claimed")
    holders = [i for i in (1, 2) if cluster.status(i).get("replica_copies") == 1]
    assert len(holders) == 1  # R = 2: exactly one replica
    replica = holders[0]
    other = 3 - replica
    cluster.pub(other, "rr", [f"r{n}" for n in range(20)], client_id="p1")
    cluster.kill(replica)
    wait_until(lambda: cluster.status(other).get("replica_copies") == 1, WAIT, "re-replicated to the survivor")
    assert cluster.status(0)["under_replicated"] == 0
    cluster.pub(other, "rr", [f"s{n}" for n in range(20)], client_id="p1")
    cluster.kill(0)  # the owner dies too: the rebuilt replica has everything
    wait_until(lambda: cluster.running_peers(other) == set(), WAIT, "the survivor alone")
    # Alone, the survivor cannot tell two dead nodes from a split it is the minority of: it does not fork the
    # session (allow_register: CONNACK 0x88) until it reaches half of the members again.
    refused = cluster.lab.exec(other, sys.executable, "-m", "tests.cluster_e2e.step_client", cluster.lab.ip(other),
                               "moved", "rr", "--qos", "1", check=False)
    assert '"connack": "CONNACK refused: 0x88"' in refused.stdout, refused.stdout + refused.stderr
    cluster.start(replica)  # the first node comes back (with a stale copy): a majority again
    wait_until(lambda: cluster.running_peers(other) == {cluster.name(replica)}, WAIT, "two of three")
    got = cluster.sub(other, "rr", "moved", 40)
    assert got == [f"r{n}" for n in range(20)] + [f"s{n}" for n in range(20)]
    assert cluster.crashes() == []
