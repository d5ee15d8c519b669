"""A real cluster node (broker + SQLite + ClusterWiring) and bare ClusterService peers, for wiring tests on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from appliance.cluster.membership import rendezvous
from appliance.cluster.service import ClusterCallbacks, ClusterConfig, ClusterService
from appliance.cluster.wire import ClusterMessage, Forward, Replicate, SessionDone
from appliance.server.cluster_wiring import ClusterWiring
from appliance.server.config import load
from appliance.server.node import Node

WAIT = 15.0


async def until(predicate: Callable[[], object], what: str) -> None:
    """Wait until predicate() is true; fail the test naming `what` after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Peer:
    """A peer as a bare ClusterService: records the forwards (committed at once), session messages and replica
    operations it is sent; acks a replica operation only when told to (its commit)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.received: list[str] = []
        self.session_messages: list[ClusterMessage] = []
        self.replicated: list[tuple[str, Replicate]] = []
        self.arrivals: list[ClusterMessage] = []  # forwards and session messages, in the order they arrived
        cfg = ClusterConfig(node_id=node_id, cluster="appliance", secret=b"k", host="127.0.0.1", port=0, mdns=False,
                            heartbeat_interval=0.2, failure_timeout=5.0, anti_entropy_interval=30.0)
        callbacks = ClusterCallbacks(on_forward=self._forward,
                                     on_session_message=self._session_message,
                                     on_replicate=lambda p, rep: self.replicated.append((p, rep)))
        self.svc = ClusterService(cfg, callbacks)

    def _session_message(self, _peer: str, msg: ClusterMessage) -> None:
        self.session_messages.append(msg)
        self.arrivals.append(msg)

    def _forward(self, peer: str, fwd: Forward) -> None:
        self.received.append(fwd.message.msg_id)
        self.arrivals.append(fwd)
        self.svc.forward_committed(peer, fwd.seq)

    def ack_replicas(self) -> None:
        """Acknowledge every replica operation received so far."""
        for peer, rep in self.replicated:
            self.svc.replicate_committed(peer, rep.seq)

    def done(self) -> list[SessionDone]:
        """The SessionDone messages received."""
        return [m for m in self.session_messages if isinstance(m, SessionDone)]


async def start_node(data_dir: Path, name: str, others: Iterable[str], failure_timeout: float = 5.0) -> Node:
    """A started node `name` with its store in data_dir, cluster on loopback without mDNS, `others` known members."""
    config = load(None, {"node": {"name": name, "data_dir": str(data_dir)},
                         "cluster": {"enabled": True, "secret": "k", "mdns": False, "bind": "127.0.0.1:0",
                                     "heartbeat_interval": 0.2, "failure_timeout": failure_timeout}})
    node = Node(config)
    node.store.open()
    snapshot = node.store.load()
    node.store.start(asyncio.get_running_loop())
    node.broker.restore(snapshot)
    wiring = wiring_of(node)
    wiring.restore(snapshot)
    await wiring.async_start()
    for member in others:
        wiring.svc.membership.known(member)
    return node


def client_replicated_on(prefix: str, replica: str, peers: tuple[str, ...] = ("nb", "nc")) -> str:
    """The first client id `prefix`N whose one replica among `peers` (rendezvous placement, R=2) is `replica`."""
    return next(c for c in (f"{prefix}{n}" for n in range(200)) if rendezvous(c, list(peers), 1) == [replica])


def wiring_of(node: Node) -> ClusterWiring:
    """The node's cluster wiring (cluster enabled)."""
    assert node.cluster is not None
    return node.cluster


async def link(a: ClusterService, b: ClusterService) -> None:
    """Have b dial a and wait until both see the link up."""
    b.async_add_seed("127.0.0.1", a.port)
    await until(lambda: a.links.is_up(b.node_id) and b.links.is_up(a.node_id), f"{a.node_id}-{b.node_id} link")


async def stop_node(node: Node) -> None:
    """Stop the node's cluster wiring and close its store."""
    await wiring_of(node).async_stop()
    node.store.close()
