"""Real `appliance run` nodes in network namespaces: formation by mDNS, point-to-point routing, retained, wills,
authentication."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.harness.netns import wait_until

from .nodes import METRICS, WAIT, Cluster, lines

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def test_three_nodes_form_a_cluster_with_no_configured_peers(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)  # no seeds: mDNS only
    cluster.start()
    cluster.wait_formed()
    for i in range(3):
        out = cluster.lab.exec(i, sys.executable, "-m", "appliance.cli", "cluster", "show", "--metrics",
                               f"127.0.0.1:{METRICS}").stdout
        rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:4]}
        assert rows == {cluster.name(j): "self" if j == i else "running" for j in range(3)}, out
        assert f"{cluster.lab.ip((i + 1) % 3)}:" in out  # peers listed with their addresses
    assert cluster.crashes() == []


def test_publishes_on_two_nodes_reach_a_subscriber_on_a_third_once_and_in_order(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    sub = cluster.spawn_sub(0, "r/#", "sub-a", qos=2, extra=("-v",))
    wait_until(lambda: cluster.owner(1, "sub-a") == "na" and cluster.owner(2, "sub-a") == "na", WAIT,
               "subscription replicated")
    b1 = [f"b1-{n}" for n in range(30)]
    c2 = [f"c2-{n}" for n in range(30)]
    b0 = [f"b0-{n}" for n in range(10)]
    cluster.pub(1, "r/b", b1, qos=1, client_id="pub-b1")
    cluster.pub(2, "r/c", c2, qos=2, client_id="pub-c2")
    cluster.pub(1, "r/b0", b0, qos=0, client_id="pub-b0")
    expected = len(b1) + len(c2) + len(b0)
    wait_until(lambda: len(lines(sub)) >= expected, WAIT, "every message delivered")
    got = [line.split(" ", 1)[1] for line in lines(sub)]
    for stream in (b1, c2, b0):
        assert [m for m in got if m.split("-")[0] == stream[0].split("-")[0]] == stream  # once each, in order
    # Point to point: node C has no subscriber, so nothing was forwarded to it.
    assert all(m["in_transit"] == 0 for m in cluster.status(1)["members"])

    # Retained on C, read by a new subscriber on A; cleared on B, gone everywhere.
    cluster.pub(2, "r/keep", ["kept"], retain=True, client_id="pub-r")
    wait_until(lambda: cluster.sub(0, "r/keep", "reader-1", 1, timeout=3, clean=True) == ["kept"], WAIT,
               "retained on A")
    cluster.pub(1, "r/keep", [""], retain=True, client_id="pub-r")
    wait_until(lambda: cluster.sub(2, "r/keep", "reader-2", 1, timeout=2, clean=True) == [], WAIT, "retained cleared")

    # A will from a client on B that dies reaches the subscriber on A.
    willer = cluster.lab.spawn(1, ["mosquitto_sub", "-h", cluster.lab.ip(1), "-t", "nothing", "-i", "willer",
                                   "--will-topic", "r/will", "--will-payload", "gone", "--will-qos", "1", "-k", "5"])
    wait_until(lambda: cluster.owner(0, "willer") == "nb", WAIT, "willer connected")
    cluster.lab.signal(willer, signal.SIGKILL)
    wait_until(lambda: "r/will gone" in lines(sub), WAIT, "will delivered across nodes")
    assert cluster.crashes() == []


def test_a_node_with_the_wrong_secret_is_refused_and_receives_nothing(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.secrets[2] = "not-the-secret"
    cluster.start()
    cluster.wait_formed([0, 1])
    spy = cluster.spawn_sub(2, "#", "spy", extra=("-v",))
    sub = cluster.spawn_sub(0, "s/#", "sub-s", extra=("-v",))
    wait_until(lambda: cluster.owner(1, "sub-s") == "na", WAIT, "subscription replicated to B")
    cluster.pub(1, "s/1", ["secret-1", "secret-2"], client_id="pub-s")
    # The intruder reaches none of the members it sees announced: a minority side, which refuses a QoS1 publish only
    # its own disk would keep for its persistent `spy` (v5 PUBACK 0x83; 3.1.1 would close and mosquitto_pub retry).
    intruder_pub = cluster.pub(2, "s/2", ["from-intruder"], client_id="pub-i", check=False, extra=("-V", "mqttv5"))
    assert "Publish 1 failed: Implementation specific error" in intruder_pub.stderr, intruder_pub.stderr
    wait_until(lambda: len(lines(sub)) >= 2, WAIT, "delivered on A")
    assert lines(sub) == ["s/1 secret-1", "s/1 secret-2"]
    assert [line for line in lines(spy) if "secret" in line] == []
    intruder = cluster.status(2)
    assert [m["node"] for m in intruder["members"] if m["state"] == "running"] == []
    assert set(intruder["owners"]) <= {"spy", "pub-i"}  # it never learned anyone else's session
    # A sees the intruder's mDNS announcement but never a working link to it.
    assert {m["node"]: m["state"] for m in cluster.status(0)["members"]}.get(cluster.name(2)) in (None, "unreachable")
    refused = cluster.procs[0].output() + cluster.procs[1].output()
    assert "refus" in refused.lower() or "authentic" in refused.lower(), refused[-2000:]


def test_connect_elsewhere_takes_the_session_over_with_its_queue_first(netns_lab) -> None:
    cluster = Cluster(netns_lab(3), 3)
    cluster.start()
    cluster.wait_formed()
    # A live connection on A is closed with DISCONNECT 0x8E when the same client id connects on B.
    holder = cluster.lab.spawn(0, [sys.executable, "-m", "tests.cluster_e2e.hold_client", cluster.lab.ip(0), "roamer"],
                               name="holder-")
    wait_until(lambda: "connected" in holder.output(), WAIT, "holder connected on A")
    wait_until(lambda: cluster.owner(1, "roamer") == "na", WAIT, "claim replicated")
    assert cluster.sub(1, "nothing", "roamer", 1, timeout=1) == []
    wait_until(lambda: "disconnect 0x8e" in holder.output(), WAIT, "0x8E on A")
    # An offline session on A with a queue moves to B: the old queue first, then newer messages.
    assert cluster.sub(0, "roam", "traveller", 1, timeout=1) == []
    wait_until(lambda: cluster.owner(2, "traveller") == "na", WAIT, "claim replicated")
    old = [f"old{n}" for n in range(50)]
    new = [f"new{n}" for n in range(50)]
    cluster.pub(2, "roam", old, client_id="pub")
    sub = cluster.spawn_sub(1, "roam", "traveller")
    wait_until(lambda: cluster.owner(2, "traveller") == "nb", WAIT, "session moved to B")
    cluster.pub(2, "roam", new, client_id="pub")
    wait_until(lambda: len(lines(sub)) >= 100, WAIT, "all delivered")
    assert lines(sub) == old + new
    assert cluster.owner(0, "traveller") == "nb"
    assert cluster.crashes() == []
