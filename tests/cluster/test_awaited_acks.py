"""Forwards the awaited old owner acknowledged before its hand-over came (chaos seed 90119, batch of main b9c3310,
reordered for sub1: pub2#26-28 late, after pub2#29-32).

node2 owned the offline sub1 and let it go to node1 (sub1's CONNECT there, 04:41:10.9) while a QoS2 hold covered its
stream to node1: the hand-over (pub2#25 queued) waited behind it and node2's claim reached node1 at once, so node1
routed its local pub2's messages for sub1 to node2 (_await_handover). node2 read #26-28 and passed them on behind
the hand-over (their acks wait for node1's ack of that pass-on); node1 kept #29-30 back (its QoS2 barrier: node0,
pub2's replica, had not acknowledged their ids) and was SIGSTOPped. node2 dropped the link (13.029), which settled
its waits on node1 (allow_publish); at the link-up (13.889) node1 resent #26-30, node2 answered the duplicates
#26-28 with an ack at once while its resent hand-over still waited behind holds, and passed the new #29-30 on
behind it. node1 adopted the hand-over (14.222, "34 queued") and retargeted what it still buffered for node2
(#29-30, pub1#44-64 from node0, pub2#31-32: "28 buffered forwards follow it") into sub1 at once; node2's #26-28
came after the hand-over, behind them. The reordering went with sub1 to node2 (its next CONNECT, 14.589).

The taker now keeps what the awaited old owner acknowledges for the session and queues it first at the adoption
(the later pass-on is dropped by message id); not at a stand-in start, whose hand-over's ids are not known yet.
A real node (broker + SQLite + ClusterWiring) on loopback; the old owner and the QoS2 publisher's replica are bare
ClusterServices replaying what node2 and node0 sent (the link drop and the duplicate ack are not replayed: to node1
that was an ack of node2 while it awaited the hand-over, as here).
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import (
    FRESH,
    MIGRATED,
    OP_QOS2_ADD,
    OP_SNAPSHOT,
    SessionClaim,
    encode_claim,
    encode_handover,
)
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import SessionState
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.cluster_sessions import FROM_OWNER
from appliance.server.node import Node
from tests.cluster.wired_node import Peer, client_replicated_on, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _message(msg_id: str, qos: int = 1, sender: str = "pub") -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), qos, False, sender, 1000.0)


def _publish_qos2(node: Node, msg_id: str, publisher: str, pid: int) -> None:
    """What the broker does for a client's QoS2 PUBLISH (id stored, replicated with the message, routed)."""
    wiring = wiring_of(node)
    message = _message(msg_id, 2, publisher)
    node.broker.sessions[publisher].incoming_qos2[pid] = None
    wiring.store.save_incoming_qos2(publisher, pid, None)
    wiring.qos2_received(message)
    _reached, _persisted, chosen = node.broker.router.route(message, wiring.remote_shared("t/x"))
    wiring.route_remote(message, chosen)


async def test_what_the_awaited_old_owner_acknowledged_goes_ahead_of_what_is_still_buffered(tmp_path: Path) -> None:
    """na owns the offline s (m0 queued) and lets it go to nb: its claim comes first, the hand-over waits. nb routes
    m1 for s to na, which acknowledges it (at the link-up, as a duplicate); p's m2 stays in nb's buffer for na (its
    packet id unacknowledged by nc). Then na's hand-over arrives, and m1 passed on behind it. s must hold m0, m1, m2.
    Before the fix nb retargeted m2 into s at the adoption, ahead of m1."""
    nb = await start_node(tmp_path / "nb", "nb", ("na", "nc"))
    wb = wiring_of(nb)
    na, nc = Peer("na"), Peer("nc")
    na.svc.spaces["sessions"] = ReplicatedSpace("sessions", "na")
    p = client_replicated_on("p", "nc", ("na", "nc"))
    try:
        for peer in (na, nc):
            await peer.svc.async_start()
            await link(wb.svc, peer.svc)
        wb.svc.put("sessions", p, encode_claim(SessionClaim("nb", 1000.0, FRESH, True, {})))
        adopt_session(nb.broker, SessionRecord(p, 1, 3600), [], [])
        await until(lambda: any(r.client_id == p and r.op == OP_SNAPSHOT for _p, r in nc.replicated), "p at nc")
        nc.ack_replicas()
        na.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        await until(lambda: "s" in wb.claims, "na's claim of s at nb")

        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        na.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1001.0, MIGRATED, True, dict(SUBS), {"na": 5})))
        await until(lambda: wb._awaited("s") == "na", "nb's claim of s at nb, the hand-over awaited")

        wb.route_remote(_message("m1"), [])  # for s: to na (the hand-over awaited), acknowledged there
        await until(lambda: "m1" in na.received and wb.svc.senders["na"].in_transit == 0, "na's ack of m1")
        _publish_qos2(nb, "m2", p, 1)  # p's id unacknowledged by nc: m2 stays in nb's buffer for na
        await until(lambda: any(r.client_id == p and r.op == OP_QOS2_ADD for _p, r in nc.replicated), "p's id at nc")
        assert "m2" not in na.received and wb.svc.senders["na"].in_transit == 1

        handover = encode_handover(1001.0, record, [Delivery(1, _message("m0"), 1, False)], [], ["m0"])
        na.svc.send("nb", SessionState(0, "s", True, bytes([FROM_OWNER]) + handover))
        passed = na.svc.forward("nb", _message("m1"), ("s",))  # passed on behind the hand-over
        await until(lambda: "s" in nb.broker.sessions and wb.svc.receivers["na"].accepted_upto == passed.seq,
                    "s adopted at nb and m1's pass-on read")
        await until(lambda: len(nb.broker.sessions["s"].queue) >= 3, "m0, m1 and m2 queued for s")
        assert [d.message.msg_id for d in nb.broker.sessions["s"].queue] == ["m0", "m1", "m2"]
    finally:
        for peer in (na, nc):
            await peer.svc.async_stop()
        await stop_node(nb)


async def test_a_stand_in_start_does_not_take_what_the_awaited_old_owner_acknowledged(tmp_path: Path) -> None:
    """na lets s go to nb (its claim first, the hand-over lost); m1, routed by nb to na, is acknowledged there: na
    had it in s and delivered it before letting s go. na is gone when s's client connects to nb: s starts from its
    claim. It must not get m1 (its client has it; the late hand-over, m0 queued, names m1 among its ids only)."""
    nb = await start_node(tmp_path / "nb", "nb", ("na", "nc"))
    wb = wiring_of(nb)
    na, nc, na_again = Peer("na"), Peer("nc"), Peer("na")
    na.svc.spaces["sessions"] = ReplicatedSpace("sessions", "na")
    try:
        for peer in (na, nc):
            await peer.svc.async_start()
            await link(wb.svc, peer.svc)
        na.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        await until(lambda: "s" in wb.claims, "na's claim of s at nb")
        na.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1001.0, MIGRATED, True, dict(SUBS), {"na": 5})))
        await until(lambda: wb._awaited("s") == "na", "nb's claim of s at nb, the hand-over awaited")
        wb.route_remote(_message("m1"), [])
        await until(lambda: "m1" in na.received and wb.svc.senders["na"].in_transit == 0, "na's ack of m1")

        await na.svc.async_stop()
        await until(lambda: not wb.svc.links.is_up("na"), "na down at nb")
        fetch = wb.prepare_connect("s", False)
        assert fetch is not None and await fetch == ReasonCode.SUCCESS
        assert [d.message.msg_id for d in nb.broker.sessions["s"].queue] == []

        await na_again.svc.async_start()
        await link(wb.svc, na_again.svc)
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        handover = encode_handover(1001.0, record, [Delivery(1, _message("m0"), 1, False)], [], ["m1", "m0"])
        na_again.svc.send("nb", SessionState(0, "s", True, bytes([FROM_OWNER]) + handover))
        await until(lambda: nb.broker.sessions["s"].queue, "the late hand-over merged")
        assert [d.message.msg_id for d in nb.broker.sessions["s"].queue] == ["m0"]
    finally:
        for peer in (na, nc, na_again):
            await peer.svc.async_stop()
        await stop_node(nb)
