"""A node that restarts and learns that its session moved on hands the winner only what the client may lack (chaos
seed 100210, batch of main 86b8ba9, 9 QoS2 duplicates for sub0).

sub0 was owned by node2, which sent it pub3#33-40 and pub2#33 (t=4.13-4.47): sub0 PUBREC'd them (RELEASED on
node2's disk; the PUBRELs waited for the replicas) and node2 was killed (4.53). sub0 reconnected to node0, which
started it from its claim, no copy (05:33:13.178). Restarted, node2 learnt node0's claim (23.680: "now owned by
node0: closing it here") and _lose forwarded its whole restored queue to node0, the RELEASED deliveries included:
held until its restart reconciliation (26.075), they reached sub0 as new messages (t=18.99, new packet ids).
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, SessionClaim, encode_claim
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 2, False, "pub", 1000.0)


async def test_a_lost_claim_hands_over_no_released_delivery(tmp_path: Path) -> None:
    """na holds s with o1 RELEASED (the client PUBREC'd it), o2 SENT and m3 QUEUED when nb's claim (a start from the
    claim: no base for na) wins: nb gets o2 and m3, never o1 (it would reach the client again as a new message)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    nb, nc = Peer("nb"), Peer("nc")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        record = SessionRecord("s", 4, 3600, subscriptions=dict(SUBS))
        adopt_session(na.broker, record, [Delivery(1, _message("o1"), 2, False, [], 7, DeliveryState.RELEASED),
                                          Delivery(2, _message("o2"), 2, False, [], 8, DeliveryState.SENT),
                                          Delivery(3, _message("m3"), 2, False)], [])
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 2000.0, MIGRATED, True, dict(SUBS))))
        await until(lambda: "s" not in na.broker.sessions, "na closing s")
        await until(lambda: [peer.ack_replicas() for peer in (nb, nc)] and len(nb.received) >= 2, "the hand-on")
        await until(lambda: not wiring.svc.senders["nb"].resend(), "nb's commits")
        assert nb.received == ["o2", "m3"], f"nb got {nb.received}: o1, PUBREC'd already, reaches the client again"
    finally:
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)
