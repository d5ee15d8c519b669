"""A stand-in start from a copy, with forwards the awaited old owner had acknowledged (chaos seed 110025, batch of
main 1385f9e, 7 reordered for sub0: pub0#165-169 and pub2#133-134 late, after pub0#170-211 and pub2#135-174).

node2 owned sub0 (replica node0) and let it go to node1's takeover question (07:08:16.49) just as node2 was
isolated: node0 got node2's claim for node1 (16.495, and relayed it), the hand-over was cut off. node1 awaited it and
routed sub0's messages to node2 (pub0's #170-211, published on node1 during the isolation, and the pub2 messages
retargeted from node0). pub0#165-169, forwarded to node2 just before the isolation and read there just after it let
sub0 go (passed on behind its hand-over), were still in node1's buffer when its link to node2 expired (18.815: their
PUBACKs went out then, allow_publish). At the link-up (19.948) node2 acknowledged them (and pub2#133-134) at once,
its waits on node1 settled, while its resent hand-over waited behind holds: node1 kept them for the adoption
(_acked_while_awaited, chaos 90119). sub0's CONNECT on node1 asked node2; the link was replaced (20.242)
with the question out, so node1 started sub0 as a stand-in from node0's copy (20.305, 56 queued: up to pub0#164 and
pub2#132) and retargeted its 81 forwards still buffered for node2 (pub0#170+, pub2#135+) into it; the stand-in start
dropped what node2 had acknowledged, which came only with node2's pass-on, behind its late hand-over (20.654) and
behind them. (The lost question is inferred: the replacement is logged 63 ms before the start.)

Now a start from a copy queues what the awaited old owner acknowledged right after the copy's queue, ahead of the
forwards still buffered for it (the copy's ids drop what the old owner had queued, delivered ones included); a
stand-in start without a copy still leaves them to the late hand-over (test_awaited_acks.py).
Real node n1 (broker + SQLite + ClusterWiring) on loopback; n2 (the old owner) and n0 (the replica, which answers
with its copy) are bare ClusterServices. n2's ack of m2 stands for node2's acks at the link-up; its link is then
gone, as node1's question to node2 was.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import (
    FRESH,
    MIGRATED,
    OP_SNAPSHOT,
    SessionClaim,
    apply_op,
    encode_claim,
    encode_copy,
    encode_handover,
    encode_snapshot,
)
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.node import Node
from tests.cluster.test_stand_in_connect import _replicated
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}
FROM_OWNER, FROM_COPY = bytes([1]), bytes([2])


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub", 1000.0)


def _queued(node: Node) -> list[str]:
    """The message ids queued for s on `node`, in order."""
    return [d.message.msg_id for d in node.broker.sessions["s"].queue]


async def test_a_stand_in_start_from_a_copy_queues_what_the_awaited_old_owner_acknowledged_first(
        tmp_path: Path) -> None:
    """n2 owned s (n0's copy: m1 queued, m0 delivered and acknowledged before) and let it go to n1; n1 awaits the
    hand-over and routes m0 and m2 for s to n2, which acknowledges both; n2's link goes, m3 stays buffered for it.
    The CONNECT on n1 starts s from n0's copy: s must hold m1, m2, m3 (not m0: the client has it). n2's late
    hand-over (m1, m2 queued) adds nothing. Before the fix the start dropped what n2 had acknowledged: m1, m3, and
    m2 came with the late hand-over, behind m3."""
    n1 = await start_node(tmp_path / "n1", "n1", ("n0", "n2"))
    wiring = wiring_of(n1)
    n0, n2, n2_again = Peer("n0"), Peer("n2"), Peer("n2")
    n2.svc.spaces["sessions"] = ReplicatedSpace("sessions", "n2")
    try:
        for peer in (n0, n2):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        n2.svc.put("sessions", "s", encode_claim(SessionClaim("n2", 1000.0, FRESH, True, dict(SUBS))))
        await until(lambda: "s" in wiring.claims, "n2's claim of s at n1")
        record = SessionRecord("s", 3, 3600, subscriptions=dict(SUBS))
        copy = apply_op(None, "n2", OP_SNAPSHOT, encode_snapshot(1000.0, record, [Delivery(2, _message("m1"), 1,
                                                                                           False)], [], seen=["m0"]))
        assert copy is not None and list(copy.seen) == ["m0", "m1"]  # n0's copy of s

        n2.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 1001.0, MIGRATED, True, dict(SUBS), {"n2": 3})))
        await until(lambda: wiring._awaited("s") == "n2", "n1's claim of s at n1, the hand-over awaited")
        wiring.route_remote(_message("m0"), [])  # for s: to n2, which acknowledges both
        wiring.route_remote(_message("m2"), [])
        await until(lambda: n2.received == ["m0", "m2"] and wiring.svc.senders["n2"].in_transit == 0,
                    "n2's acks of m0 and m2")
        await n2.svc.async_stop()  # the question's link is gone
        await until(lambda: not wiring.svc.links.is_up("n2"), "n2 down at n1")
        wiring.route_remote(_message("m3"), [])  # buffered for n2
        assert wiring.svc.senders["n2"].in_transit == 1

        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None
        answered = asyncio.ensure_future(fetch)
        await until(lambda: answered.done() or any(isinstance(m, SessionTakeover) for m in n0.session_messages),
                    "n1 asks n0 (or starts s)")
        for ask in [m for m in n0.session_messages if isinstance(m, SessionTakeover)]:
            n0.svc.send("n1", SessionState(ask.request_id, "s", True, FROM_COPY + encode_copy(copy)))
        assert await answered == ReasonCode.SUCCESS
        assert _queued(n1) == ["m1", "m2", "m3"]

        await n2_again.svc.async_start()
        await link(wiring.svc, n2_again.svc)
        handover = encode_handover(1001.0, record, [Delivery(2, _message("m1"), 1, False),
                                                    Delivery(3, _message("m2"), 1, False)], [], ["m0", "m1", "m2"])
        n2_again.svc.send("n1", SessionState(0, "s", True, FROM_OWNER + handover))  # resent at the link-up
        await _replicated(n0, lambda: n2_again.done(), "SessionDone for the late hand-over")  # n0: s's replica
        assert _queued(n1) == ["m1", "m2", "m3"]
    finally:
        for peer in (n0, n2, n2_again):
            await peer.svc.async_stop()
        await stop_node(n1)
