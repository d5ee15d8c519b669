"""Discovery by real multicast mDNS and authenticated links between processes in separate network namespaces."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from tests.harness.netns import Lab, NodeProcess, wait_until

pytestmark = pytest.mark.netns

SECRET = "ns-secret"
WAIT = 40.0  # generous bound for an expected event (TTL 4 s + zeroconf's 10 s cache sweep + slack)


def start(lab: Lab, i: int, node: str, cluster: str = "lab", secret: str = SECRET, *extra: str) -> NodeProcess:
    argv = [sys.executable, "-m", "tests.cluster.mini_node", "--cluster", cluster, "--node", node,
            "--secret", secret, *extra]
    return lab.spawn(i, argv, name=node)


def events(p: NodeProcess) -> list[dict]:
    out = []
    for line in p.output().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def probe(lab: Lab, i: int, service_type: str) -> list[dict]:
    out = lab.exec(i, sys.executable, "-m", "tests.cluster.mdns_probe", service_type, "3").stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def count(p: NodeProcess, ev: str, **match: object) -> int:
    return sum(1 for e in events(p) if e["ev"] == ev and all(e.get(k) == v for k, v in match.items()))


def test_mdns_discovery_links_partition_and_heal(netns_lab) -> None:
    lab: Lab = netns_lab(3)
    a = start(lab, 0, "na", "lab", SECRET, "--mqtts-port", "8883")
    b = start(lab, 1, "nb")
    other = start(lab, 2, "nc", "elsewhere")  # same LAN, another cluster name
    for p in (a, b, other):
        wait_until(lambda p=p: count(p, "ready") or not p.alive(), WAIT, f"{p.log_path.name} ready")
        assert p.alive(), p.output()

    wait_until(lambda: count(a, "found", peer="nb") and count(b, "found", peer="na"), WAIT, "na and nb find each other")
    assert any(e["addr"] == lab.ip(1) for e in events(a) if e["ev"] == "found")
    wait_until(lambda: count(a, "up", peer="nb") and count(b, "up", peer="na"), WAIT, "authenticated link")
    wait_until(lambda: count(b, "msg", peer="na", type="Digest"), WAIT, "data over the link")
    # The other cluster's announcements did arrive (positive control) and were ignored on both sides.
    wait_until(lambda: any("ignoring node nc" in e.get("msg", "") for e in events(a)), WAIT, "nc seen by na")
    assert count(a, "found", peer="nc") == 0 and count(b, "found", peer="nc") == 0
    assert count(other, "found") == 0

    # LAN clients find brokers: every node's _mqtt._tcp, and _secure-mqtt._tcp only where TLS is on.
    mqtt = probe(lab, 2, "_mqtt._tcp.local.")
    assert {(m["txt"]["node"], m["port"]) for m in mqtt} >= {("na", 1883), ("nb", 1883), ("nc", 1883)}
    assert any(lab.ip(0) in m["addresses"] for m in mqtt if m["txt"]["node"] == "na")
    secure = probe(lab, 2, "_secure-mqtt._tcp.local.")
    assert [(m["txt"]["node"], m["port"]) for m in secure] == [("na", 8883)]

    assert count(a, "lost") == 0 and count(b, "lost") == 0  # live peers' records were kept fresh, no flapping

    # Partition nb: its link fails, its mDNS records expire, and nobody re-adds it while the split lasts.
    lab.isolate(1)
    wait_until(lambda: count(a, "down", peer="nb"), WAIT, "link failure detected at na")
    wait_until(lambda: count(a, "lost", peer="nb"), WAIT, "nb removed from na's peers after the TTL")
    found_before = count(a, "found", peer="nb")
    up_before = count(a, "up", peer="nb")
    assert up_before == 1

    # Heal: found again by a fresh query, and the link comes back.
    lab.rejoin(1)
    wait_until(lambda: count(a, "found", peer="nb") > found_before, WAIT, "nb found again after heal")
    wait_until(lambda: count(a, "up", peer="nb") > up_before and count(b, "up", peer="na") >= 2, WAIT, "link back")

    lab.signal(a, signal.SIGTERM)
    wait_until(lambda: count(a, "stopped"), WAIT, "orderly stop")
    wait_until(lambda: count(b, "down", peer="na"), WAIT, "goodbye seen at nb")
    assert any("peer left" in e["reason"] for e in events(b) if e["ev"] == "down")


def test_wrong_secret_refused_across_namespaces_and_sigstop_detected(netns_lab) -> None:
    lab: Lab = netns_lab(3)
    a = start(lab, 0, "na")
    b = start(lab, 1, "nb")
    intruder = start(lab, 2, "nx", "lab", "not-the-secret")
    wait_until(lambda: count(a, "up", peer="nb") and count(b, "up", peer="na"), WAIT, "good pair links")
    wait_until(lambda: count(a, "found", peer="nx") and count(intruder, "found", peer="na"), WAIT, "nx discovered")
    refused = lambda p: any("refused" in e.get("msg", "") and e["level"] == "WARNING" for e in events(p))  # noqa: E731
    wait_until(lambda: refused(a) and refused(b), WAIT, "intruder refused and logged by both members")
    wait_until(lambda: refused(intruder), WAIT, "intruder sees the members' proofs fail too")
    assert count(intruder, "up") == 0 and count(intruder, "msg") == 0
    assert count(a, "up", peer="nx") == 0 and count(b, "up", peer="nx") == 0

    # SIGSTOP: the frozen node stops answering heartbeats and is reported down; SIGCONT brings the link back.
    lab.signal(b, signal.SIGSTOP)
    wait_until(lambda: count(a, "down", peer="nb"), WAIT, "frozen node detected")
    lab.signal(b, signal.SIGCONT)
    wait_until(lambda: count(a, "up", peer="nb") >= 2, WAIT, "link back after SIGCONT")

    lab.kill(b)
    ups = count(a, "up", peer="nb")
    wait_until(lambda: count(a, "down", peer="nb") >= 2, WAIT, "killed node detected")
    assert count(a, "up", peer="nb") == ups


def test_static_seed_without_multicast(netns_lab) -> None:
    lab: Lab = netns_lab(2)
    a = start(lab, 0, "na", "lab", SECRET, "--no-mdns", "--seed", f"{lab.ip(1)}", "--seed", f"{lab.ip(0)}:7946")
    b = start(lab, 1, "nb", "lab", SECRET, "--no-mdns")
    wait_until(lambda: count(a, "up", peer="nb") and count(b, "up", peer="na"), WAIT, "link from a static seed")
    wait_until(lambda: count(b, "msg", peer="na"), WAIT, "data over the seeded link")
    assert count(a, "found") == 0  # no mDNS involved
