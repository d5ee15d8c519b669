"""A real cluster node (broker + SQLite + ClusterWiring) and bare ClusterService peers, for wiring tests on loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import MIGRATED, OP_SNAPSHOT, SessionClaim, encode_claim
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


def route_on(node: Node, message: Message) -> int:
    """What the broker does with a PUBLISH on `node`: local routing, then the forwards; the local sessions reached."""
    wiring = wiring_of(node)
    reached, _persisted, chosen = node.broker.router.route(message, wiring.remote_shared(message.topic))
    wiring.route_remote(message, chosen)
    return reached


def publish_qos2_on(node: Node, publisher: str, pid: int, message: Message) -> int:
    """What the broker does for a client's QoS2 PUBLISH: the packet id stored and replicated with the message (until
    the publisher's replicas acknowledge it, the streams to the other peers are held), then the routing."""
    wiring = wiring_of(node)
    node.broker.sessions[publisher].incoming_qos2[pid] = None
    wiring.store.save_incoming_qos2(publisher, pid, None)
    wiring.qos2_received(message)
    return route_on(node, message)


async def relay_claim(relay: Peer, src: ClusterWiring, dst: ClusterWiring, cid: str, owner: str) -> None:
    """The bare `relay` passes src's current claim of `cid` on to dst (a digest exchange would, later), and dst
    then sees `owner` own it."""
    space = relay.svc.spaces["sessions"]
    await until(lambda: space.value(cid) == src.svc.spaces["sessions"].value(cid), f"{owner}'s claim of {cid} at relay")
    value = space.value(cid)
    assert value is not None
    relay.svc.put("sessions", cid, value)
    await until(lambda: cid in dst.claims and dst.claims[cid].owner == owner, f"{owner}'s claim of {cid} at dst")


async def own_replicated(node: Node, replica: Peer, sessions: dict[str, dict[str, SubscriptionOptions]]) -> None:
    """`node` owns each session (its claim written, the session adopted, empty) and `replica` acknowledged their
    snapshots."""
    wiring = wiring_of(node)
    for cid, subs in sessions.items():
        claim = SessionClaim(wiring.svc.node_id, 1000.0, MIGRATED, True, dict(subs))
        wiring.svc.put("sessions", cid, encode_claim(claim))
        adopt_session(node.broker, SessionRecord(cid, 1, 3600, subscriptions=dict(subs)), [], [])
    await until(lambda: {r.client_id for _p, r in replica.replicated if r.op == OP_SNAPSHOT} >= set(sessions),
                "snapshots")
    replica.ack_replicas()


async def link(a: ClusterService, b: ClusterService) -> None:
    """Have b dial a and wait until both see the link up."""
    b.async_add_seed("127.0.0.1", a.port)
    await until(lambda: a.links.is_up(b.node_id) and b.links.is_up(a.node_id), f"{a.node_id}-{b.node_id} link")


async def stop_node(node: Node) -> None:
    """Stop the node's cluster wiring and close its store."""
    await wiring_of(node).async_stop()
    node.store.close()


async def packet_id_cut_off_then_replica_back(na: Node, nb: Peer, nc: Peer, back: Peer, pub: str,
                                              reached_nc: Callable[[], bool], what: str) -> None:
    """nb, pub's replica, stops; pub's QoS2 m1 (packet id 1) is published on na, its id left in na's stream to nb;
    once `reached_nc()` (`what`) nc stops too (na a minority side, its waits on nc held); nb comes back as `back`
    with its replication state, and links up with na."""
    wiring = wiring_of(na)
    committed = nb.svc.replica_receivers["na"].committed_upto
    await nb.svc.async_stop()
    await until(lambda: "nb" not in wiring._live(), "nb down at na")
    publish_qos2_on(na, pub, 1, Message("m1", "t/x", b"m1", 2, False, pub, 1000.0))
    await until(reached_nc, what)
    await nc.svc.async_stop()
    await until(lambda: wiring._held_down == {"nc"}, "nc down at na, a minority side: its waits held")
    back.svc.restore_replication("na", committed_upto=committed)
    await back.svc.async_start()
    await link(wiring.svc, back.svc)
