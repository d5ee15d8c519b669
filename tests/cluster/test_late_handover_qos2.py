"""A late hand-over repeated QoS2 messages the subscriber had (chaos seed 80276, batch of main 336dcf4, 16 QoS2
duplicates for sub0: pub2#34-39, pub3#32-37, pub2#45-46, pub3#43-44).

node0 let the offline sub0 go to node2 (churn) and was SIGKILLed before its hand-over left (behind QoS2 holds); node2
started sub0 from its claim (04:15:46.146), later handed it to node1 (57.677). Restarted, node0 resent the hand-over
(ho/sub0) once reconciled (59.182); node2, no longer the owner, passed all of it on to node1 (59.330: "35 of 35
queued"), which delivered as new (1) pub2#34-39 and pub3#32-37: RELEASED in the hand-over (sub0's PUBRECs had reached
node0: the client had them); nobody after node0 knew their ids; (2) pub2#45-46 and pub3#43-44: QoS2 messages whose
ids never reached their publishers' replicas; pub2 and pub3 resumed elsewhere without them, their DUP resends were
routed as new (sub0 got those at node2), and node0's restart reconciliation dropped its own forwards and queued
copies of them, but not the copies in its unconfirmed hand-over.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import (
    FRESH,
    FROM_REPLICA,
    SessionClaim,
    decode_handover,
    encode_claim,
    encode_handover,
)
from appliance.cluster.wire import SessionState, SessionTakeover
from tests.cluster.wired_node import (
    Peer,
    client_replicated_on,
    link,
    own_replicated,
    publish_qos2_on,
    route_on,
    start_node,
    stop_node,
    until,
    wiring_of,
)

SUBS = {"t/#": SubscriptionOptions(qos=2)}




async def test_a_late_hand_over_passed_on_leaves_out_what_the_subscriber_released(tmp_path: Path) -> None:
    """nb's hand-over of s reaches na after s moved on to nc (na started it from its claim meanwhile and handed it
    on): m1 is RELEASED in it (the client sent PUBREC: it has m1), m2 SENT, m3 queued. na passes m2 and m3 on to nc,
    not m1: nc never knew m1's id and would deliver it as new, a QoS2 duplicate (the merge into a session still
    here already leaves RELEASED ones out)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    old_owner, owner = Peer("nb"), Peer("nc")
    wiring = wiring_of(na)
    try:
        for peer in (old_owner, owner):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nc", 3000.0, FRESH, True, dict(SUBS))))
        queue = [Delivery(1, Message("m1", "t/x", b"x", 2, False, "pub", 1001.0), 2, False, [], 7,
                          DeliveryState.RELEASED),
                 Delivery(2, Message("m2", "t/x", b"x", 2, False, "pub", 1002.0), 2, False, [], 8, DeliveryState.SENT),
                 Delivery(3, Message("m3", "t/x", b"x", 2, False, "pub", 1003.0), 2, False)]
        state = encode_handover(2000.0, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), queue, [], [])
        old_owner.svc.send("na", SessionState(0, "s", True, bytes([1]) + state))  # resent at link-up: FROM_OWNER
        await until(lambda: "m3" in owner.received, "the hand-over's messages at nc")
        assert owner.received == ["m2", "m3"], f"nc got {owner.received}: m1 reached the client already"
        assert "s" not in na.broker.sessions
    finally:
        for peer in (old_owner, owner):
            await peer.svc.async_stop()
        await stop_node(na)




@pytest.mark.parametrize("asked", [False, True])
async def test_a_restarted_owner_resends_its_hand_over_without_what_a_resumed_publisher_took_over(
        tmp_path: Path, asked: bool) -> None:
    """na owns the QoS2 publisher p (replica nc) and the offline s (m1 queued). p publishes q1 (packet id 1) for s;
    nc has not acknowledged the id when nb takes s over: the hand-over (m1, q1) waits behind the hold, and na dies.
    p resumes at nc from na's copy, which lacked id 1 (its DUP resend is routed there as new, under another message
    id). Restarted, na learns p's claim and drops its own copies of q1; the hand-over it resends to nb must not
    carry q1 either (nor its id: a pending copy passed on by p's new owner would be dropped as a repeat); nor the
    answer if nb asks for s again before na has reconciled."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    p, s = client_replicated_on("p", "nc"), client_replicated_on("s", "nc")
    nb, nc = Peer("nb"), Peer("nc")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        await own_replicated(na, nc, {s: SUBS, p: {}})
        route_on(na, Message("m1", "t/x", b"m1", 1, False, "pub", 1000.0))
        # nc does not acknowledge id 1: nb's streams are held
        publish_qos2_on(na, p, 1, Message("q1", "t/x", b"x", 2, False, p, 1001.0))
        await until(lambda: [d.message.msg_id for d in na.broker.sessions[s].queue] == ["m1", "q1"], "s's queue")
        nb.svc.send("na", SessionTakeover(7, s, "nb", False))
        await until(lambda: wiring.claims[s].owner == "nb", "s let go to nb")
        assert not [m for m in nb.session_messages if isinstance(m, SessionState)]  # behind the hold
    finally:
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)  # SIGKILL: the hand-over and q1's tag stay on na's disk

    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    nb = Peer("nb")
    try:
        assert s in wiring._handing
        resumed = SessionClaim("nc", 5000.0, FROM_REPLICA, True, {}, {"na": 1}, {"na": 1})  # from na's copy
        wiring.svc.put("sessions", p, encode_claim(resumed))  # learnt from a digest at the restart
        await nb.svc.async_start()
        await link(wiring.svc, nb.svc)
        if asked:
            nb.svc.send("na", SessionTakeover(9, s, "nb", False))
        await until(lambda: [m for m in nb.session_messages if isinstance(m, SessionState)], "the hand-over at nb")
        [state] = [m for m in nb.session_messages if isinstance(m, SessionState)]
        assert state.request_id == (9 if asked else 0)
        _epoch, _record, queue, _qos2, seen = decode_handover(state.data[1:])
        assert [d.message.msg_id for d in queue] == ["m1"], "q1 went with the hand-over: nb delivers it twice"
        assert "q1" not in seen
        assert "q1" not in [d.message.msg_id for d in decode_handover(wiring._handing[s][1][1:])[2]]
    finally:
        await nb.svc.async_stop()
        await stop_node(na)
