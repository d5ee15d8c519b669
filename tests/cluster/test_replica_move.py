"""A replica copy is dropped only once its successor holds the session (chaos seed 40041, a session lost). node2
adopted sub1 by a hand-over while partitioned from node0, its first choice of replica: the copy went to node1 when
node0's link dropped, and back to node0 when it returned, 1.1 s later. That move dropped node1's copy at once; the
snapshot for node0 never arrived (node2 was isolated ~0.1 s after the link-up, its link to node1 lasted ~0.5 s
longer and carried the drop). sub1, reconnecting to node0 on the majority side, found no copy: node1 answered "no
session" and node0 had none, so it started a fresh session (57 acknowledged messages lost, the old owner's merge
at the heal brought QoS2 duplicates). Now a copy on a live node that placement leaves stays fed until every new
replica has acknowledged its snapshot, then gets OP_DROP. Also chaos seed 40042 (found re-running 40041): messages a
losing node handed to the winner, which died before acknowledging them, were dropped from the session resumed there
as second copies (the loser still remembered their ids).

A real owner and replica (broker + SQLite + ClusterWiring) and a bare ClusterService peer on loopback.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import (
    FROM_REPLICA,
    MIGRATED,
    OP_DROP,
    OP_SNAPSHOT,
    SessionClaim,
    encode_claim,
    encode_snapshot,
)
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import Forward, SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", b"x", 1, False, "pub0", 1000.0)


async def test_a_copy_left_by_placement_stays_until_the_new_replica_holds_the_snapshot(tmp_path: Path) -> None:
    """na owns s, replicated on nc while nb (placement's first choice) is down. nb returns: placement moves to nb,
    whose snapshot is not acknowledged yet (it never would be if na were cut off now). nc's copy must stay, and
    keep getting s's writes, until nb acknowledges; then it is dropped. Before the fix nc got OP_DROP at once: a
    resume while nb lacked the snapshot found no copy anywhere."""
    cid = next(c for c in (f"s{n}" for n in range(100)) if rendezvous(c, ["nb", "nc"], 1) == ["nb"])
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    nc = await start_node(tmp_path / "nc", "nc", ("na", "nb"))
    nb = Peer("nb")  # acknowledges replica writes only when told
    try:
        owner, replica = wiring_of(na), wiring_of(nc)
        await link(owner.svc, replica.svc)
        owner.svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        adopt_session(na.broker, SessionRecord(cid, 3, 3600, subscriptions=dict(SUBS)), [], [])
        owner._deliver_here(_message("m1"), (cid,))
        await until(lambda: cid in replica.copies and len(replica.copies[cid].queue) == 1, "s's copy on nc")

        await nb.svc.async_start()
        await link(owner.svc, nb.svc)  # membership change: placement moves s to nb (rebalance)
        await until(lambda: any(r.client_id == cid and r.op == OP_SNAPSHOT for _p, r in nb.replicated),
                    "s's snapshot at nb")
        owner._deliver_here(_message("m2"), (cid,))
        await until(lambda: any(r.client_id == cid and r.op != OP_SNAPSHOT for _p, r in nb.replicated),
                    "m2's write at nb")
        await until(lambda: cid not in replica.copies or len(replica.copies[cid].queue) == 2, "m2's write at nc")
        assert cid in replica.copies, "nc's copy of s was dropped before nb held the snapshot"

        nb.ack_replicas()
        await until(lambda: cid not in replica.copies, "nc's copy dropped once nb held s")
        assert owner.assigned[cid] == ["nb"]
        assert not any(r.client_id == cid and r.op == OP_DROP for _p, r in nb.replicated)
    finally:
        await nb.svc.async_stop()
        await stop_node(nc)
        await stop_node(na)


async def _answer_no_session(peer: Peer, asker: str) -> None:
    """The peer answers every takeover question "no session here" (it holds no copy), as node1 did in the run."""
    answered = 0
    while True:
        questions = [m for m in peer.session_messages if isinstance(m, SessionTakeover)]
        for question in questions[answered:]:
            peer.svc.send(asker, SessionState(question.request_id, question.client_id, False, b""))
        answered = len(questions)
        await asyncio.sleep(0.02)


async def test_a_session_resumes_from_the_left_copy_when_the_owner_is_cut_off_mid_move(tmp_path: Path) -> None:
    """The run's sequence: placement moves s from nc to nb, the owner na is cut off before nb acknowledges the
    snapshot, and s's client reconnects to nc (nb answers "no session"). nc resumes s from its copy with both queued
    messages; before the fix that copy was dropped and s started fresh, empty (session present = 0)."""
    cid = next(c for c in (f"s{n}" for n in range(100)) if rendezvous(c, ["nb", "nc"], 1) == ["nb"])
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    nc = await start_node(tmp_path / "nc", "nc", ("na", "nb"))
    nb = Peer("nb")
    na_running = True
    answering: asyncio.Task[None] | None = None
    try:
        owner, replica = wiring_of(na), wiring_of(nc)
        await link(owner.svc, replica.svc)
        owner.svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        adopt_session(na.broker, SessionRecord(cid, 3, 3600, subscriptions=dict(SUBS)), [], [])
        owner._deliver_here(_message("m1"), (cid,))
        await until(lambda: cid in replica.copies and len(replica.copies[cid].queue) == 1, "s's copy on nc")
        await until(lambda: cid in replica.claims, "na's claim of s at nc")

        await nb.svc.async_start()
        await link(replica.svc, nb.svc)
        answering = asyncio.get_running_loop().create_task(_answer_no_session(nb, "nc"))
        await link(owner.svc, nb.svc)  # placement moves s to nb; nb never acknowledges the snapshot
        await until(lambda: any(r.client_id == cid and r.op == OP_SNAPSHOT for _p, r in nb.replicated),
                    "s's snapshot at nb")
        owner._deliver_here(_message("m2"), (cid,))
        await until(lambda: any(r.client_id == cid and r.op != OP_SNAPSHOT for _p, r in nb.replicated),
                    "m2's write at nb")

        await stop_node(na)  # cut off: the client reconnects to nc
        na_running = False
        await until(lambda: not replica.svc.links.is_up("na"), "na down at nc")
        fetch = replica.prepare_connect(cid, False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        session = nc.broker.sessions.get(cid)
        assert session is not None, "no copy to resume s from: the CONNECT starts a fresh session"
        assert [d.message.msg_id for d in session.queue] == ["m1", "m2"]
    finally:
        if answering is not None:
            answering.cancel()
        await nb.svc.async_stop()
        await stop_node(nc)
        if na_running:
            await stop_node(na)


class FrozenTarget(Peer):
    """A peer that never acknowledges forwards (it dies with them in flight)."""

    def _forward(self, peer: str, fwd: Forward) -> None:
        self.received.append(fwd.message.msg_id)


async def test_messages_handed_to_a_winner_that_died_reach_the_session_resumed_here(tmp_path: Path) -> None:
    """Chaos seed 40042 (found re-running 40041): na, isolated, queued m1 for its session s while nb resumed s on
    the majority side; at the heal na lost to nb's claim and handed m1 over on the forward stream. nb died before
    acknowledging it, and na resumed s from its replica copy of nb's session: the forward buffered for nb follows
    s here and must be queued. Before the fix na still remembered m1's id from the session it had lost and dropped
    it as a second copy (185 acknowledged messages lost)."""
    na = await start_node(tmp_path / "na", "na", ("nb",))
    nb = FrozenTarget("nb")
    nb.svc.spaces["sessions"] = ReplicatedSpace("sessions", "nb")  # nb claims s
    try:
        wiring = wiring_of(na)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        record = SessionRecord("s", 3, 3600, subscriptions=dict(SUBS))
        adopt_session(na.broker, record, [], [])
        wiring._deliver_here(_message("m1"), ("s",))  # queued while na was cut off

        await nb.svc.async_start()
        await link(wiring.svc, nb.svc)
        nb.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 2000.0, FROM_REPLICA, True, dict(SUBS))))
        await until(lambda: "m1" in nb.received, "m1 handed to nb")
        assert "s" not in na.broker.sessions
        nb.svc.replicate("na", "s", OP_SNAPSHOT, encode_snapshot(2000.0, record, [], []))
        await until(lambda: "s" in wiring.copies, "na's copy of nb's session")

        await nb.svc.async_stop()  # nb dies with m1 unacknowledged
        await until(lambda: not wiring.svc.links.is_up("nb"), "nb down at na")
        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        assert [d.message.msg_id for d in na.broker.sessions["s"].queue] == ["m1"]
    finally:
        await nb.svc.async_stop()
        await stop_node(na)


async def test_a_session_started_fresh_for_want_of_a_copy_is_logged(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Chaos seed 41027 (the 40041 race: sub2's copy left by placement was dropped at once, the new replica never
    held the snapshot, the owner was killed): the node the client reconnected to found no copy and started the
    session fresh without a word, which made the run slow to diagnose. Now it warns, naming the peers it asked."""
    nc = await start_node(tmp_path / "nc", "nc", ("na", "nb"))
    nb = Peer("nb")
    answering: asyncio.Task[None] | None = None
    try:
        wiring = wiring_of(nc)
        await nb.svc.async_start()
        await link(wiring.svc, nb.svc)
        answering = asyncio.get_running_loop().create_task(_answer_no_session(nb, "nc"))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None
        with caplog.at_level(logging.WARNING, logger="appliance.cluster"):
            assert await fetch == ReasonCode.SUCCESS
        assert "s" not in nc.broker.sessions  # the CONNECT goes on with a fresh session
        assert any("session s: owner na unreachable and no copy here or at nb: starting it fresh" in r.getMessage()
                   for r in caplog.records)
    finally:
        if answering is not None:
            answering.cancel()
        await nb.svc.async_stop()
        await stop_node(nc)
