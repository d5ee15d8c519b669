"""A hand-over is not done until the new owner's replicas hold the session (chaos seed 10171): the old owner handed
a session to a node that was SIGKILLed ~0.1 s later, before its replica had the session; the client reconnected to
the third node, whose question the old owner answered "no session here", and got a fresh session (94 acknowledged
messages missing).

Real nodes (broker + SQLite + ClusterWiring) and real ClusterServices as the other peers, on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import FRESH, OP_SNAPSHOT, SessionClaim, decode_handover, encode_claim, encode_handover
from appliance.cluster.wire import SessionDone, SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}


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
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    nc = await start_node(tmp_path / "nc", "nc", ("na", "nb"))
    taker = Peer("nb")
    cid = _client_placed_on("nb", ["nb", "nc"])
    try:
        await taker.svc.async_start()
        await link(wiring_of(na).svc, taker.svc)  # only nb is live at na: s is replicated to nb
        record = SessionRecord(cid, 5, 3600, subscriptions=dict(SUBS))
        adopt_session(na.broker, record, _deliveries(3), [])
        wiring_of(na).svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        await until(lambda: any(r.client_id == cid and r.op == OP_SNAPSHOT for _p, r in taker.replicated),
                     "nb holding na's copy of s")
        taker.ack_replicas()
        await link(wiring_of(na).svc, wiring_of(nc).svc)

        taker.svc.send("na", SessionTakeover(7, cid, "nb", clean_start))
        await until(lambda: any(isinstance(m, SessionState) for m in taker.session_messages), "the hand-over at nb")
        await until(lambda: cid in wiring_of(nc).claims and wiring_of(nc).claims[cid].owner == "nb", "nb's claim at nc")
        assert cid not in na.broker.sessions
        await taker.svc.async_stop()  # SIGKILL: no SessionDone, and nothing of s on any replica of nb
        await until(lambda: not wiring_of(na).svc.links.is_up("nb") and not wiring_of(nc).svc.links.is_up("nb"),
                     "nb down at na and nc")

        fetch = wiring_of(nc).prepare_connect(cid, False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        if clean_start:
            assert cid not in nc.broker.sessions  # a fresh session: nb was told to discard the old one
            return
        session = nc.broker.sessions[cid]
        assert [d.message.msg_id for d in session.queue] == ["m1", "m2", "m3"]
        await until(lambda: [d.message.msg_id for d in nc.store.load().queues.get(cid, [])] == ["m1", "m2", "m3"],
                     "s with its queue on nc's disk")
    finally:
        await taker.svc.async_stop()
        await stop_node(nc)
        await stop_node(na)


async def test_a_client_back_at_the_old_owner_resumes_from_its_unconfirmed_hand_over(tmp_path: Path) -> None:
    """Chaos seed 10427: na handed s to nb, which was cut off before its replica held s (the client never got its
    CONNACK there), so nb had not confirmed the hand-over. The client comes back to na. nb is unreachable, nc has no
    copy ("no session here"): na resumes s from the hand-over it made (before the fix: a fresh session)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    taker, other = Peer("nb"), Peer("nc")
    other.svc.cb.on_session_message = lambda p, m: (
        other.svc.send(p, SessionState(m.request_id, m.client_id, False, b""))
        if isinstance(m, SessionTakeover) else None)
    cid = _client_placed_on("nb", ["nb", "nc"])
    wiring = wiring_of(na)
    try:
        await taker.svc.async_start()
        await link(wiring.svc, taker.svc)
        adopt_session(na.broker, SessionRecord(cid, 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [])
        wiring.svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        taker.svc.send("na", SessionTakeover(7, cid, "nb", False))
        await until(lambda: any(isinstance(m, SessionState) for m in taker.session_messages), "the hand-over at nb")
        await taker.svc.async_stop()
        await until(lambda: not wiring.svc.links.is_up("nb"), "nb down at na")
        await other.svc.async_start()
        await link(wiring.svc, other.svc)
        fetch = wiring.prepare_connect(cid, False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        assert [d.message.msg_id for d in na.broker.sessions[cid].queue] == ["m1", "m2", "m3"]
        assert cid not in wiring._handing  # superseded: not resent to nb when it returns
    finally:
        await taker.svc.async_stop()
        await other.svc.async_stop()
        await stop_node(na)


async def test_the_new_owner_confirms_a_hand_over_only_once_its_replicas_hold_the_session(tmp_path: Path) -> None:
    """na takes s over from nb; na's replica for s is nc. SessionDone (after which nb forgets its hand-over state)
    must not leave before nc acknowledged the session's snapshot: until then nb's hand-over is the only copy
    besides na's disk. Before the fix na said SessionDone as soon as the state arrived."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    old_owner, replica = Peer("nb"), Peer("nc")
    cid = _client_placed_on("nc", ["nb", "nc"])
    wiring = wiring_of(na)
    try:
        for peer in (old_owner, replica):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", cid, encode_claim(SessionClaim("nb", 1000.0, FRESH, True, dict(SUBS))))
        fetch = wiring.prepare_connect(cid, False)
        assert fetch is not None
        task = asyncio.get_running_loop().create_task(fetch)
        await until(lambda: old_owner.session_messages, "na's question at nb")
        [question] = old_owner.session_messages
        assert isinstance(question, SessionTakeover)
        state = encode_handover(2000.0, SessionRecord(cid, 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [], [])
        old_owner.svc.send("na", SessionState(question.request_id, cid, True, bytes([1]) + state))  # FROM_OWNER
        assert await task == ReasonCode.SUCCESS
        await until(lambda: any(r.client_id == cid and r.op == OP_SNAPSHOT for _p, r in replica.replicated),
                     "na's snapshot of s at nc")
        old_owner.svc.send("na", SessionTakeover(99, "nobody", "nb", False))  # a probe answered on the same link
        await until(lambda: len(old_owner.session_messages) == 2, "the probe's answer at nb")
        assert old_owner.done() == []  # the replica has not acknowledged yet
        replica.ack_replicas()
        await until(lambda: old_owner.done(), "SessionDone at nb")
        assert old_owner.done() == [SessionDone(question.request_id, cid)]
    finally:
        await old_owner.svc.async_stop()
        await replica.svc.async_stop()
        await stop_node(na)


async def test_a_late_hand_over_of_a_session_that_moved_on_goes_to_its_owner(tmp_path: Path) -> None:
    """na died before confirming nb's hand-over of s (nothing of s on na's disk); meanwhile the client reconnected
    to nc, which started s fresh (its claim is newer than the hand-over). nb resends the hand-over when na is back:
    na must not adopt s (nobody would deliver its queue: nc owns it), it forwards the 3 messages to nc."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    old_owner, owner = Peer("nb"), Peer("nc")
    received = owner.received
    wiring = wiring_of(na)
    try:
        for peer in (old_owner, owner):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nc", 3000.0, FRESH, True, dict(SUBS))))
        state = encode_handover(2000.0, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [], [])
        old_owner.svc.send("na", SessionState(0, "s", True, bytes([1]) + state))  # resent at link-up: FROM_OWNER
        await until(lambda: len(received) == 3, "the hand-over's messages at nc")
        assert received == ["m1", "m2", "m3"]
        assert "s" not in na.broker.sessions
        await until(lambda: old_owner.done(), "SessionDone at nb")  # once nc acknowledged them
    finally:
        await old_owner.svc.async_stop()
        await owner.svc.async_stop()
        await stop_node(na)


async def test_a_hand_over_resent_at_link_up_goes_ahead_of_the_forwards_that_followed_it(tmp_path: Path) -> None:
    """Chaos seed 30270: na, just continued after SIGSTOP, answered nb's late takeover question for s on a link
    that turned out dead (the SessionState was lost), then routed a newer message m4 for s to nb, its new owner.
    At the link's return the buffered forward went out first and the hand-over (m1..m3) only after it: nb
    delivered m4, then merged m1..m3 behind it (reordered). The hand-over must go out ahead of those forwards."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    taker = Peer("nb")
    arrivals: list[str] = []
    taker.svc.cb.on_forward = lambda p, fwd: (arrivals.append(fwd.message.msg_id),
                                              taker.svc.forward_committed(p, fwd.seq))
    taker.svc.cb.on_session_message = lambda _p, m: arrivals.append(type(m).__name__)
    wiring = wiring_of(na)
    try:
        adopt_session(na.broker, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [])
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        wiring._on_session_message("nb", SessionTakeover(7, "s", "nb", False))  # answered while nb is unreachable
        assert "s" not in na.broker.sessions and wiring.claims["s"].owner == "nb"
        wiring.route_remote(Message("m4", "t/x", b"x", 1, False, "pub", 1004.0), [])  # buffered for nb
        await taker.svc.async_start()
        await link(wiring.svc, taker.svc)
        await until(lambda: "m4" in arrivals and "SessionState" in arrivals, "the hand-over and m4 at nb")
        assert arrivals.index("SessionState") < arrivals.index("m4")
    finally:
        await taker.svc.async_stop()
        await stop_node(na)


async def test_a_hand_over_lost_with_its_link_survives_a_restart_of_the_old_owner(tmp_path: Path) -> None:
    """na let s go to nb, its answer lost with their link (the window of chaos seeds 30318 and 30649), and na was
    killed and restarted before the link returned. s is gone from na's disk and its replicas dropped their copies:
    the hand-over state, in na's memory, was the session's only copy (its 3 acknowledged messages lost). It must
    survive the restart and go to nb when their link comes up."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    taker = Peer("nb")
    try:
        adopt_session(na.broker, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), _deliveries(3), [])
        wiring_of(na).svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        wiring_of(na)._on_session_message("nb", SessionTakeover(7, "s", "nb", False))  # the answer is lost
        assert "s" not in na.broker.sessions
        await until(lambda: "s" not in na.store.load().sessions, "s gone from na's disk")
        await stop_node(na)
        na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
        await taker.svc.async_start()
        await link(wiring_of(na).svc, taker.svc)
        await until(lambda: any(isinstance(m, SessionState) for m in taker.session_messages), "the hand-over at nb")
        state = next(m for m in taker.session_messages if isinstance(m, SessionState))
        assert [d.message.msg_id for d in decode_handover(state.data[1:])[2]] == ["m1", "m2", "m3"]
        taker.svc.send("na", SessionDone(state.request_id, "s"))  # adopted and durable at nb: na forgets it
        await until(lambda: "s" not in wiring_of(na)._handing, "na's hand-over state released")
        await stop_node(na)
        na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
        assert "s" not in wiring_of(na)._handing
    finally:
        await taker.svc.async_stop()
        await stop_node(na)
