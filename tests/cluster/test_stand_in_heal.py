"""A hand-over resent at a link-up while a QoS2 hold covers the taker's stream (chaos seed 80084, batch of main
336dcf4, reordered for sub2: pub0#185, pub1#183-184 late, and pub3#130-134).

node0 owned the offline sub2 (pub1#183, pub0#185, pub1#184, pub3#130-134 queued). node1 asked for it as the
node0-node1 partition was applied: node0 let sub2 go (8 queued) and wrote node1's claim, which node2 relayed, while
the hand-over died with the link. node0 then forwarded pub0#186.., pub1#185.. (its local publishers) for sub2 to
node1: buffered, the link down. sub2's retried CONNECT on node1 started the session from its claim (03:57:21.994,
node0 unreachable). At the heal (link up 22.73) node0 resent its hand-over behind the holds on node1's stream
(7659742: a QoS2 id of pub3, node0's local QoS2 publisher, not yet acknowledged by its replica), then its forward
buffer at once: node1 delivered pub0#186.. to sub2 (client clock 13.72) and merged the hand-over's 8 only when it
came (23.396, "late hand-over by node0 merged (8 of 8 queued)"; the client got them at 14.03). A hand-over's own hold
covered only the forwards submitted after it, not those already buffered behind the one lost with the link.

Real nodes (broker + SQLite + ClusterWiring) on loopback, a bare ClusterService as the relay and QoS2 replica.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, OP_QOS2_ADD, SessionClaim, encode_claim
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import SessionTakeover
from appliance.protocol.packets import MQTT_5, Connect, Properties, Publish
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import (
    Peer,
    client_replicated_on,
    link,
    publish_qos2_on,
    relay_claim,
    start_node,
    stop_node,
    until,
    wiring_of,
)
from tests.unit.broker.test_restore import RecordingLink

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _message(msg_id: str, qos: int = 1, sender: str = "pub0") -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), qos, False, sender, 1000.0)


def _payloads(client: RecordingLink) -> list[bytes]:
    return [p.payload for p in client.sent if isinstance(p, Publish)]




async def test_a_hand_over_resent_behind_a_hold_at_link_up_precedes_the_forwards_buffered_after_it(
        tmp_path: Path) -> None:
    """na (node0) owns the offline s (m1 queued) and the QoS2 publisher q (replica nc). nb's takeover question
    reaches na with their link down: the hand-over (m1) is lost, nb's claim reaches nb through nc, na forwards m2
    (a local QoS1 publish) for s to nb: buffered. s's CONNECT on nb starts it from its claim. q publishes m3 (QoS2):
    its id not yet acknowledged by nc, na's stream to nb is held. At the link-up na's hand-over waits behind that
    hold: the client must get m1, m2, m3. Before the fix m2 (buffered before the link-up) went out at once, ahead of
    the hand-over, and m1 was merged behind it."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=2.0)
    nb = await start_node(tmp_path / "nb", "nb", ("na", "nc"), failure_timeout=2.0)
    relay = Peer("nc")
    relay.svc.spaces["sessions"] = ReplicatedSpace("sessions", "nc")
    wa, wb = wiring_of(na), wiring_of(nb)
    q = client_replicated_on("q", "nc")

    try:
        await relay.svc.async_start()
        await link(wa.svc, relay.svc)
        await link(wb.svc, relay.svc)
        wa.svc.put("sessions", q, encode_claim(SessionClaim("na", 1000.0, FRESH, True, {})))
        adopt_session(na.broker, SessionRecord(q, 1, 3600), [], [])
        adopt_session(na.broker, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)),
                      [Delivery(1, _message("m1"), 1, False)], [])
        wa.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))
        await relay_claim(relay, wa, wb, "s", "na")

        wa._on_session_message("nb", SessionTakeover(7, "s", "nb", False))  # nb's question; the answer is lost
        assert "s" not in na.broker.sessions and wa.claims["s"].owner == "nb"
        await relay_claim(relay, wa, wb, "s", "nb")  # nb's claim reaches nb through nc, ahead of the hand-over
        wa.route_remote(_message("m2"), [])  # published on na: buffered for s's new owner

        fetch = wb.prepare_connect("s", False)  # na unreachable from nb: s starts from its claim
        assert fetch is not None and await fetch == ReasonCode.SUCCESS
        client = RecordingLink(MQTT_5)
        assert nb.broker.connect(client, Connect("s", MQTT_5, False, 60,
                                                 properties=Properties(session_expiry_interval=3600)),
                                 ReasonCode.SUCCESS) is not None

        publish_qos2_on(na, q, 1, _message("m3", 2, q))  # q's id at nc, unacknowledged: na's stream to nb is held
        await until(lambda: any(r.client_id == q and r.op == OP_QOS2_ADD for _p, r in relay.replicated),
                    "q's packet id at nc")

        await link(wa.svc, wb.svc)
        await until(lambda: "nb" in wa.svc._behind, "na's resent hand-over waiting behind q's hold")
        relay.ack_replicas()  # the hold ends: the hand-over goes, then what it held
        await until(lambda: len(_payloads(client)) >= 3, "m1, m2 and m3 at the client")
        assert _payloads(client) == [b"m1", b"m2", b"m3"]
    finally:
        await relay.svc.async_stop()
        await stop_node(na)
        await stop_node(nb)
