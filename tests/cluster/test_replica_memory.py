"""What a replica copy holds (chaos seed 30033, a QoS2 duplicate). node0 took sub1 over by a hand-over (the ids sub1
had had came with it) and placed a new replica, which learnt only the 24 queued ids from its snapshot. node0 was
SIGKILLed; sub1 resumed from that copy on node1 and received, as new, pub2's message #131 that it had completed
6.7 s earlier: pub2's copy, resumed on node2, still held #131 as pending and passed it on again, and nothing
remembered its id. Now a snapshot carries the owner's ids; a pending QoS2 message whose packet id the copy no longer
holds is not passed on (its release missed the copy); and a copy that placement leaves is dropped (one left behind
by a placement that moved away and back within one rebalance delay kept every pending message released after it:
seen in traced runs of the same seed).

Real nodes (broker + SQLite + ClusterWiring) and bare ClusterService peers on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import (
    FRESH,
    MIGRATED,
    ReplicaCopy,
    SessionClaim,
    apply_op,
    encode_claim,
    encode_handover,
)
from appliance.cluster.wire import Forward, Replicate, encode
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", b"x", 2, False, "pub2", 1000.0)


async def test_a_session_resumed_from_a_replica_placed_after_a_hand_over_drops_what_it_had_before(
        tmp_path: Path) -> None:
    """na adopts s by a hand-over: m1 was delivered and completed on the old owner (only its id comes along), m2 is
    still queued. na places s's replica on nb (a snapshot) and dies. s resumes on nb from that copy; a late copy of
    m1 then reaches s (a stale pending message passed on, a retargeted forward): it is dropped, not delivered as new.
    Before the fix the snapshot carried only the queued ids, so m1 was queued again: a QoS2 duplicate."""
    na = await start_node(tmp_path / "na", "na", ("nb",))
    nb = await start_node(tmp_path / "nb", "nb", ("na",))
    na_running = True
    try:
        await link(wiring_of(na).svc, wiring_of(nb).svc)
        claim = SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))
        wiring_of(na).svc.put("sessions", "s", encode_claim(claim))
        await until(lambda: "s" in wiring_of(nb).claims, "na's claim of s at nb")
        record = SessionRecord("s", 3, 3600, subscriptions=dict(SUBS))
        handed = encode_handover(900.0, record, [Delivery(2, _message("m2"), 2, False)], [], ["m1", "m2"])
        wiring_of(na)._on_handover("nc", "s", handed, False, True)  # the old owner "nc" hands s over
        await until(lambda: "s" in wiring_of(nb).copies, "nb holding na's copy of s")

        await stop_node(na)  # gone without handing s over: nb resumes it from its copy
        na_running = False
        await until(lambda: not wiring_of(nb).svc.links.is_up("na"), "na down at nb")
        fetch = wiring_of(nb).prepare_connect("s", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        session = nb.broker.sessions["s"]
        assert [d.message.msg_id for d in session.queue] == ["m2"]

        wiring_of(nb)._on_forward("nc", Forward(7, _message("m1"), ("s",)))  # m1 again, from a stale pending entry
        wiring_of(nb)._on_forward("nc", Forward(8, _message("m3"), ("s",)))  # a new message is delivered
        assert [d.message.msg_id for d in session.queue] == ["m2", "m3"]
    finally:
        await stop_node(nb)
        if na_running:
            await stop_node(na)


class FrozenTarget(Peer):
    """A peer that never acknowledges forwards (its node froze with them in flight)."""

    def _forward(self, peer: str, fwd: Forward) -> None:
        self.received.append(fwd.message.msg_id)


def _copy(ops: list[tuple[str, Replicate]], cid: str) -> ReplicaCopy | None:
    """The copy a replica holds after applying, in stream order, the operations it accepted for `cid`."""
    copy: ReplicaCopy | None = None
    for peer, rep in sorted(ops, key=lambda op: op[1].seq):
        if rep.client_id == cid:
            copy = apply_op(copy, peer, rep.op, rep.data)
    return copy


async def _acking(peer: Peer) -> None:
    while True:
        peer.ack_replicas()
        await asyncio.sleep(0.02)


async def test_a_copy_left_by_placement_is_dropped_not_kept_with_released_pending_messages(tmp_path: Path) -> None:
    """na owns the QoS2 publisher pub, replicated on nb. m1 (for s on nb) is pending: its packet id and the message
    are on nb, its forward is unacknowledged. nb goes down: placement moves to nc (a snapshot with m1 pending). nb
    returns and nc goes down before a rebalance ran: placement moves back to nb, and m1, now acknowledged, is
    released there. nc's copy, left behind, must be dropped when nc is back; before the fix it kept m1 pending
    (the rebalance found placement unchanged), and a session resumed from it passed m1 on again."""
    node = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(node)
    pub = next(c for c in (f"p{n}" for n in range(100)) if rendezvous(c, ["nb", "nc"], 1) == ["nb"])
    nb, nc = FrozenTarget("nb"), Peer("nc")
    back: list[Peer] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, FRESH, True, {})))
        adopt_session(node.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: _copy(nb.replicated, pub) is not None, "pub's first snapshot at nb")
        nb.ack_replicas()
        wiring._rebalance_pending = True  # the flaps below fall within one rebalance delay (0.2 s), as in the run

        acked: list[str] = []
        m1 = Message("m1", "t/x", b"x", 2, False, pub, 1000.0)
        wiring.store.save_incoming_qos2(pub, 1, None)  # what the broker does for a QoS2 PUBLISH
        wiring.qos2_received(m1)
        wiring.route_remote(m1, [])
        wiring.store.after_commit(acked.append, "PUBREC m1")
        await until(lambda: "m1" in nb.received, "m1's forward at nb")

        await nb.svc.async_stop()
        await until(lambda: wiring.assigned.get(pub) == ["nc"], "pub's placement moved to nc")
        nb_back = Peer("nb")
        back.append(nb_back)
        await nb_back.svc.async_start()
        await link(wiring.svc, nb_back.svc)
        tasks.append(asyncio.get_running_loop().create_task(_acking(nb_back)))
        await nc.svc.async_stop()
        await until(lambda: wiring.assigned.get(pub) == ["nb"], "pub's placement back on nb")
        await until(lambda: acked, "m1 acknowledged")
        nc_back = Peer("nc")
        back.append(nc_back)
        await nc_back.svc.async_start()
        await link(wiring.svc, nc_back.svc)
        wiring._rebalance_pending = False
        wiring._rebalance()  # placement unchanged: nb
        await until(lambda: any(r.client_id == pub for _p, r in nc_back.replicated), "na's resent writes at nc")
        await asyncio.sleep(0.3)

        current = _copy(nb.replicated + nb_back.replicated, pub)
        assert current is not None and current.stranded == {}  # m1 released on the current replica
        left = _copy(nc.replicated + nc_back.replicated, pub)
        assert left is None, f"nc kept pub's copy with {sorted(left.stranded)} pending"
    finally:
        for task in tasks:
            task.cancel()
        for peer in (nb, nc, *back):
            await peer.svc.async_stop()
        await stop_node(node)


async def test_a_pending_qos2_message_whose_packet_id_was_released_is_not_passed_on(tmp_path: Path) -> None:
    """A resumed publisher's copy holds three pending QoS2 messages: m1 under packet id 5, which the copy no longer
    holds (its PUBREL was replicated, so the message was acknowledged and its pending entry released: that release
    missed this copy), m2 under id 6, still held, and m3 from an older node (no id recorded). m2 and m3 are routed
    again; m1 is not. Before the fix m1 was routed again too: chaos 30033's pub2#131, 7 s after its PUBCOMP."""
    node = await start_node(tmp_path / "na", "na", ())
    try:
        adopt_session(node.broker, SessionRecord("s", 1, 3600, subscriptions=dict(SUBS)), [], [])
        pending = {f"{mark:020d}/": encode(Forward(pid, _message(msg_id), ()))
                   for mark, pid, msg_id in ((1, 5, "m1"), (2, 6, "m2"), (3, 0, "m3"))}
        copy = ReplicaCopy("nb", 1000.0, SessionRecord("pub2", 1, 3600), {}, {6}, stranded=pending)
        assert wiring_of(node).pass_on_stranded(copy) == 2
        assert [d.message.msg_id for d in node.broker.sessions["s"].queue] == ["m2", "m3"]
    finally:
        await stop_node(node)
