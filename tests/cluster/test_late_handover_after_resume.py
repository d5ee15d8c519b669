"""A hand-over lost on a dead link, resent after the taker resumed the session from its replica (chaos seed 70930,
batch of b17eeca, 3 QoS1 messages lost for sub2): node1 asked node0 for sub2 as node0 was isolated; node0 let sub2
go with pub1#140-142 queued (published there 0.4 s earlier, not yet on node1's replica) and wrote node1's claim
(seen by node2 only), while the hand-over was stuck on the dead link. node1's ask ended without an answer; sub2's
retried CONNECT on node1 resumed it from node1's replica (owner node0 unreachable), under a newer claim. At the heal
node0 resent its hand-over: node1 owned sub2 under a claim newer than the hand-over's epoch, so _on_handover took it
for a resend it already had and dropped it unlogged, then confirmed it (SessionDone): node0 forgot the only copy.

Real nodes (broker + SQLite + ClusterWiring) on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.protocol.packets import MQTT_5, Connect, Properties, Publish
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import link, start_node, stop_node, until, wiring_of
from tests.unit.broker.test_restore import RecordingLink

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _payloads(client: RecordingLink) -> list[bytes]:
    return [p.payload for p in client.sent if isinstance(p, Publish)]


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub1", 1000.0)


async def test_a_hand_over_resent_after_the_taker_resumed_from_its_replica_is_merged_not_dropped(
        tmp_path: Path) -> None:
    """na owns s (m1 queued, on nb's replica). na lets s go to nb with m2 queued too (not on the replica yet) and
    the hand-over is lost with the link; s resumes on nb from its replica (m1). na's hand-over, resent at the heal,
    must bring m2 into s. Before the fix nb owned s under a claim newer than the hand-over: dropped as a resend."""
    na = await start_node(tmp_path / "na", "na", ("nb",))
    nb = await start_node(tmp_path / "nb", "nb", ("na",))
    na_running = True
    try:
        await link(wiring_of(na).svc, wiring_of(nb).svc)
        wiring_of(na).svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        await until(lambda: "s" in wiring_of(nb).claims, "na's claim of s at nb")
        record = SessionRecord("s", 3, 3600, subscriptions=dict(SUBS))
        handed = encode_handover(900.0, record, [Delivery(2, _message("m1"), 1, False)], [], ["m1"])
        wiring_of(na)._on_handover("nc", "s", handed, False, True)  # na holds s with m1 queued
        await until(lambda: "s" in wiring_of(nb).copies, "nb holding na's copy of s")

        await stop_node(na)  # cut off with its hand-over of s to nb unsent
        na_running = False
        await until(lambda: not wiring_of(nb).svc.links.is_up("na"), "na down at nb")
        fetch = wiring_of(nb).prepare_connect("s", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS  # resumed from nb's replica
        client = RecordingLink(MQTT_5)
        assert nb.broker.connect(client, Connect("s", MQTT_5, False, 60,
                                                 properties=Properties(session_expiry_interval=3600)),
                                 ReasonCode.SUCCESS) is not None
        await until(lambda: wiring_of(nb).claims["s"].owner == "nb", "nb's claim of s (the resumed session)")
        assert wiring_of(nb).claims["s"].epoch > 1500.0
        await until(lambda: _payloads(client) == [b"m1"], "m1 delivered from the replica")

        # na's hand-over to nb (its epoch older than nb's resume claim), resent at the heal
        late = encode_handover(1500.0, SessionRecord("s", 4, 3600, subscriptions=dict(SUBS)),
                               [Delivery(2, _message("m1"), 1, False), Delivery(3, _message("m2"), 1, False)],
                               [], ["m1", "m2"])
        wiring_of(nb)._on_handover("na", "s", late, False, False)
        await until(lambda: b"m2" in _payloads(client), "m2 delivered")  # late, not lost
    finally:
        await stop_node(nb)
        if na_running:
            await stop_node(na)
