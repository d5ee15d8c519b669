"""The namespace lab itself: addressing, nftables partition between two nodes, leftovers of a crashed run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.harness.netns import Lab, clean_leftovers, netns_unavailable, wait_until

pytestmark = pytest.mark.netns


def reachable(lab: Lab, i: int, j: int) -> bool:
    """One TCP connect from node i to a listener on node j (real traffic, bounded)."""
    code = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(1.0)\n"
        f"sys.exit(0 if s.connect_ex(('{lab.ip(j)}', 9)) == 0 else 1)\n"
    )
    return lab.exec(i, sys.executable, "-c", code, check=False).returncode == 0


def test_partition_between_two_nodes_leaves_the_third_connected(netns_lab) -> None:
    lab: Lab = netns_lab(3)
    listeners = [lab.spawn(i, [sys.executable, "-c", _LISTEN]) for i in range(3)]
    for i in range(3):
        wait_until(lambda i=i: "listening" in listeners[i].output(), 15, f"listener {i}")
    assert reachable(lab, 0, 1) and reachable(lab, 1, 2) and reachable(lab, 0, 2)
    lab.partition(0, 1)
    assert not reachable(lab, 0, 1) and not reachable(lab, 1, 0)
    assert reachable(lab, 0, 2) and reachable(lab, 1, 2)
    lab.heal(0, 1)
    assert reachable(lab, 0, 1) and reachable(lab, 1, 0)
    lab.isolate(2)
    assert not reachable(lab, 0, 2)
    lab.rejoin(2)
    assert reachable(lab, 0, 2)
    lab.partition(0, 1)
    lab.partition(1, 2)
    lab.isolate(0)
    assert not reachable(lab, 1, 2) and not reachable(lab, 2, 0)
    lab.heal_all()
    assert reachable(lab, 0, 1) and reachable(lab, 1, 2) and reachable(lab, 2, 0)


_LISTEN = (
    "import socket\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 9)); s.listen()\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    c,_=s.accept(); c.close()\n"
)


def test_teardown_removes_everything_and_leftovers_of_dead_runs_are_cleaned() -> None:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs: the "crashed earlier run"
    crashed = Lab(1, owner=dead.pid)
    crashed.up()
    crashed.spawn(0, ["sleep", "300"])
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert crashed.ns(0) in names and crashed.hub in names
    removed = clean_leftovers()  # what the next run does first
    assert set(removed) >= {crashed.ns(0), crashed.hub}
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert crashed.ns(0) not in names
    crashed.processes[0].popen.wait(timeout=10)  # its process was killed with the namespace

    with Lab(2) as lab:
        assert lab.exec(1, "ip", "-4", "addr", "show", "eth0").stdout.count(lab.ip(1)) == 1
        mine = lab.ns(0)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert mine not in names
