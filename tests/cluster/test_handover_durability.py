"""A hand-over is not done until the new owner's replicas hold the session (chaos seed 10171): the old owner handed
a session to a node that was SIGKILLed ~0.1 s later, before its replica had the session; the client reconnected to
the third node, whose question the old owner answered "no session here", and got a fresh session (94 acknowledged
messages missing).

Real nodes (broker + SQLite + ClusterWiring) and real ClusterServices as the other peers, on loopback.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import FRESH, OP_SNAPSHOT, SessionClaim, encode_claim, encode_handover
from appliance.cluster.service import ClusterCallbacks, ClusterConfig, ClusterService
from appliance.cluster.wire import ClusterMessage, Replicate, SessionDone, SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.cluster_wiring import ClusterWiring
from appliance.server.config import load
from appliance.server.node import Node

WAIT = 15.0
SUBS = {"t/#": SubscriptionOptions(qos=1)}


async def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class Peer:
    """A peer as a bare ClusterService: records the session messages and replica operations it is sent; acks a
    replica operation only when told to (its commit)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.session_messages: list[ClusterMessage] = []
        self.replicated: list[tuple[str, Replicate]] = []
        cfg = ClusterConfig(node_id=node_id, cluster="appliance", secret=b"k", host="127.0.0.1", port=0, mdns=False,
                            heartbeat_interval=0.2, failure_timeout=5.0, anti_entropy_interval=30.0)
        callbacks = ClusterCallbacks(on_session_message=lambda _p, m: self.session_messages.append(m),
                                     on_replicate=lambda p, rep: self.replicated.append((p, rep)))
        self.svc = ClusterService(cfg, callbacks)

    def ack_replicas(self) -> None:
        for peer, rep in self.replicated:
            self.svc.replicate_committed(peer, rep.seq)

    def done(self) -> list[SessionDone]:
        return [m for m in self.session_messages if isinstance(m, SessionDone)]


async def _node(tmp_path: Path, name: str, others: tuple[str, ...]) -> Node:
    config = load(None, {"node": {"name": name, "data_dir": str(tmp_path / name)},
                         "cluster": {"enabled": True, "secret": "k", "mdns": False, "bind": "127.0.0.1:0",
                                     "heartbeat_interval": 0.2, "failure_timeout": 5.0}})
    node = Node(config)
    node.store.open()
    snapshot = node.store.load()
    node.store.start(asyncio.get_running_loop())
    node.broker.restore(snapshot)
    wiring = node.cluster
    assert wiring is not None
    wiring.restore(snapshot)
    await wiring.async_start()
    for member in others:
        wiring.svc.membership.known(member)
    return node


def _wiring(node: Node) -> ClusterWiring:
    assert node.cluster is not None
    return node.cluster


async def _link(a: ClusterService, b: ClusterService) -> None:
    b.async_add_seed("127.0.0.1", a.port)
    await _until(lambda: a.links.is_up(b.node_id) and b.links.is_up(a.node_id), f"{a.node_id}-{b.node_id} link")


async def _stop(node: Node) -> None:
    await _wiring(node).async_stop()
    node.store.close()


def _client_placed_on(replica: str, others: list[str]) -> str:
    """A client id whose single replica, chosen among `others`, is `replica`."""
    return next(cid for cid in (f"s{n}" for n in range(100)) if rendezvous(cid, others, 1) == [replica])


def _deliveries(n: int) -> list[Delivery]:
    return [Delivery(i, Message(f"m{i}", "t/x", b"x", 1, False, "pub", 1000.0 + i), 1, False) for i in range(1, n + 1)]


@pytest.mark.parametrize("clean_start", [False, True])
async def test_a_session_handed_to_a_node_that_dies_resumes_from_the_old_owners_hand_over(
        tmp_path: Path, clean_start: bool) -> None:
    """na owns s (3 queued); its replica is nb. nb takes s over (na hands it over and writes nb's claim) and dies
    before confirming it: no replica of nb holds s. The client reconnects to nc: nc asks na, which answers with the
    hand-over it made (nb's claim, unconfirmed), so nc resumes s with its 3 messages. Before the fix na answered
    "no session here" and nc started s fresh. If nb had taken s over with clean start, the old state is not
    offered (the client asked for it to be discarded)."""
    na = await _node(tmp_path, "na", ("nb", "nc"))
    nc = await _node(tmp_path, "nc", ("na", "nb"))
    taker = Peer("nb")
    cid = _client_placed_on("nb", ["nb", "nc"])
    try:
        await taker.svc.async_start()
        await _link(_wiring(na).svc, taker.svc)  # only nb is live at na: s is replicated to nb
        record = SessionRecord(cid, 5, 3600, subscriptions=dict(SUBS))
        adopt_session(na.broker, record, _deliveries(3), [])
        _wiring(na).svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        await _until(lambda: any(r.client_id == cid and r.op == OP_SNAPSHOT for _p, r in taker.replicated),
                     "nb holding na's copy of s")
        taker.ack_replicas()
        await _link(_wiring(na).svc, _wiring(nc).svc)

        taker.svc.send("na", SessionTakeover(7, cid, "nb", clean_start))
        await _until(lambda: any(isinstance(m, SessionState) for m in taker.session_messages), "the hand-over at nb")
        await _until(lambda: cid in _wiring(nc).claims and _wiring(nc).claims[cid].owner == "nb", "nb's claim at nc")
        assert cid not in na.broker.sessions
        await taker.svc.async_stop()  # SIGKILL: no SessionDone, and nothing of s on any replica of nb
        await _until(lambda: not _wiring(na).svc.links.is_up("nb") and not _wiring(nc).svc.links.is_up("nb"),
                     "nb down at na and nc")

        fetch = _wiring(nc).prepare_connect(cid, False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        if clean_start:
            assert cid not in nc.broker.sessions  # a fresh session: nb was told to discard the old one
            return
        session = nc.broker.sessions[cid]
        assert [d.message.msg_id for d in session.queue] == ["m1", "m2", "m3"]
        await _until(lambda: [d.message.msg_id for d in nc.store.load().queues.get(cid, [])] == ["m1", "m2", "m3"],
                     "s with its queue on nc's disk")
    finally:
        await taker.svc.async_stop()
        await _stop(nc)
        await _stop(na)


async def test_a_client_back_at_the_old_owner_resumes_from_its_unconfirmed_hand_over(tmp_path: Path) -> None:
    """Chaos seed 10427: na handed s to nb, which was cut off before its replica held s (the client never got its
    CONNACK there), so nb had not confirmed the hand-over. The client comes back to na. nb is unreachable, nc has no
    copy ("no session here"): na resumes s from the hand-over it made (before the fix: a fresh session)."""
    na = await _node(tmp_path, "na", ("nb", "nc"))
    taker, other = Peer("nb"), Peer("nc")
    other.svc.cb.on_session_message = lambda p, m: (
        other.svc.send(p, SessionState(m.request_id, m.client_id, False, b""))
        if isinstance(m, SessionTakeover) else None)
    cid = _client_placed_on("nb", ["nb", "nc"])
    wiring = _wiring(na)
    try:
        await taker.svc.async_start()
        await _link(wiring.svc, taker.svc)
        adopt_session(na.broker, SessionRecord(cid, 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [])
        wiring.svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        taker.svc.send("na", SessionTakeover(7, cid, "nb", False))
        await _until(lambda: any(isinstance(m, SessionState) for m in taker.session_messages), "the hand-over at nb")
        await taker.svc.async_stop()
        await _until(lambda: not wiring.svc.links.is_up("nb"), "nb down at na")
        await other.svc.async_start()
        await _link(wiring.svc, other.svc)
        fetch = wiring.prepare_connect(cid, False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        assert [d.message.msg_id for d in na.broker.sessions[cid].queue] == ["m1", "m2", "m3"]
        assert cid not in wiring._handing  # superseded: not resent to nb when it returns
    finally:
        await taker.svc.async_stop()
        await other.svc.async_stop()
        await _stop(na)


async def test_the_new_owner_confirms_a_hand_over_only_once_its_replicas_hold_the_session(tmp_path: Path) -> None:
    """na takes s over from nb; na's replica for s is nc. SessionDone (after which nb forgets its hand-over state)
    must not leave before nc acknowledged the session's snapshot: until then nb's hand-over is the only copy
    besides na's disk. Before the fix na said SessionDone as soon as the state arrived."""
    na = await _node(tmp_path, "na", ("nb", "nc"))
    old_owner, replica = Peer("nb"), Peer("nc")
    cid = _client_placed_on("nc", ["nb", "nc"])
    wiring = _wiring(na)
    try:
        for peer in (old_owner, replica):
            await peer.svc.async_start()
            await _link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", cid, encode_claim(SessionClaim("nb", 1000.0, FRESH, True, dict(SUBS))))
        fetch = wiring.prepare_connect(cid, False)
        assert fetch is not None
        task = asyncio.get_running_loop().create_task(fetch)
        await _until(lambda: old_owner.session_messages, "na's question at nb")
        [question] = old_owner.session_messages
        assert isinstance(question, SessionTakeover)
        state = encode_handover(2000.0, SessionRecord(cid, 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [], [])
        old_owner.svc.send("na", SessionState(question.request_id, cid, True, bytes([1]) + state))  # FROM_OWNER
        assert await task == ReasonCode.SUCCESS
        await _until(lambda: any(r.client_id == cid and r.op == OP_SNAPSHOT for _p, r in replica.replicated),
                     "na's snapshot of s at nc")
        old_owner.svc.send("na", SessionTakeover(99, "nobody", "nb", False))  # a probe answered on the same link
        await _until(lambda: len(old_owner.session_messages) == 2, "the probe's answer at nb")
        assert old_owner.done() == []  # the replica has not acknowledged yet
        replica.ack_replicas()
        await _until(lambda: old_owner.done(), "SessionDone at nb")
        assert old_owner.done() == [SessionDone(question.request_id, cid)]
    finally:
        await old_owner.svc.async_stop()
        await replica.svc.async_stop()
        await _stop(na)


async def test_a_late_hand_over_of_a_session_that_moved_on_goes_to_its_owner(tmp_path: Path) -> None:
    """na died before confirming nb's hand-over of s (nothing of s on na's disk); meanwhile the client reconnected
    to nc, which started s fresh (its claim is newer than the hand-over). nb resends the hand-over when na is back:
    na must not adopt s (nobody would deliver its queue: nc owns it), it forwards the 3 messages to nc."""
    na = await _node(tmp_path, "na", ("nb", "nc"))
    old_owner, owner = Peer("nb"), Peer("nc")
    received: list[str] = []
    owner.svc.cb.on_forward = lambda p, fwd: (received.append(fwd.message.msg_id),
                                              owner.svc.forward_committed(p, fwd.seq))
    wiring = _wiring(na)
    try:
        for peer in (old_owner, owner):
            await peer.svc.async_start()
            await _link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nc", 3000.0, FRESH, True, dict(SUBS))))
        state = encode_handover(2000.0, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [], [])
        old_owner.svc.send("na", SessionState(0, "s", True, bytes([1]) + state))  # resent at link-up: FROM_OWNER
        await _until(lambda: len(received) == 3, "the hand-over's messages at nc")
        assert received == ["m1", "m2", "m3"]
        assert "s" not in na.broker.sessions
        await _until(lambda: old_owner.done(), "SessionDone at nb")  # once nc acknowledged them
    finally:
        await old_owner.svc.async_stop()
        await owner.svc.async_stop()
        await _stop(na)
