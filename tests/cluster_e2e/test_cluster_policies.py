"""Refusing netsplit policies on real nodes: allow_publish / allow_subscribe = false and under_replicated = refuse
answer with reason codes while a node is down, and accept again once it is back."""

from __future__ import annotations

import subprocess

import pytest

from tests.harness.netns import wait_until

from .nodes import MQTT, WAIT, Cluster, lines

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def _v5(cluster: Cluster, i: int, *argv: str) -> str:
    """Run a mosquitto tool with MQTT 5 and debug output in node i's namespace; return its output."""
    proc = subprocess.run(["ip", "netns", "exec", cluster.lab.ns(i), argv[0], "-h", cluster.lab.ip(i), "-p",
                           str(MQTT), "-V", "mqttv5", "-d", *argv[1:]], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


def test_refusing_policies_answer_with_reason_codes_while_a_node_is_down(netns_lab) -> None:
    cluster = Cluster(netns_lab(2), 2, allow_publish=False, allow_subscribe=False, under_replicated="refuse")
    cluster.start()
    cluster.wait_formed()
    sub = cluster.spawn_sub(1, "far/#", "far-sub")
    wait_until(lambda: cluster.owner(0, "far-sub") == "nb", WAIT, "subscription replicated")
    assert "RC:0)" in _v5(cluster, 0, "mosquitto_pub", "-t", "far/1", "-m", "before", "-q", "1")
    wait_until(lambda: lines(sub) == ["before"], WAIT, "delivered while both are up")
    cluster.lab.kill(sub)  # the persistent session stays on B

    cluster.kill(1)
    wait_until(lambda: cluster.running_peers(0) == set(), WAIT, "A sees B down")
    # allow_publish = false: the subscriber's node is down -> PUBACK 0x83, nothing acknowledged on one disk.
    assert "RC:131)" in _v5(cluster, 0, "mosquitto_pub", "-t", "far/2", "-m", "during", "-q", "1")
    # under_replicated = refuse: fewer than R nodes reachable -> PUBACK 0x97 even with no remote subscriber.
    assert "RC:151)" in _v5(cluster, 0, "mosquitto_pub", "-t", "near/1", "-m", "x", "-q", "1")
    # allow_subscribe = false: SUBACK 0x80 while a known node is down.
    assert "Subscribed (mid: 1): 128" in _v5(cluster, 0, "mosquitto_sub", "-t", "near/#", "-q", "1", "-W", "1")

    cluster.start(1)
    cluster.wait_formed()
    assert "RC:0)" in _v5(cluster, 0, "mosquitto_pub", "-t", "far/3", "-m", "after", "-q", "1")
    assert "Subscribed (mid: 1): 1" in _v5(cluster, 0, "mosquitto_sub", "-t", "near/#", "-q", "1", "-W", "1")
    assert cluster.sub(1, "far/#", "far-sub", 1, timeout=10) == ["after"]  # "during" was never accepted
    assert cluster.crashes() == []
