"""A hand-over lost on a dead link, resent after the taker started the session fresh (chaos seed 100453, batch of
86b8ba9, 59 acknowledged messages lost for sub1, session lost): node1 asked node2 for sub1 just as the 2-1
partition began; node2 released sub1 (pub0#190-197, pub1#189-196, pub2#142-152, pub3#124+ queued), pushed node1's
claim (node0 got it, node1 did not) and dropped node0's copy at once, while the hand-over was cut off with the link.
node1's ask ended unanswered (CONNECT refused); at the retry its claim still named node2 (unreachable) and node0 had
no copy: "starting it fresh". At the heal node2 resent its hand-over; node1 owned sub1 under a newer claim, so
_on_handover took it for a resend it already had, dropped it unlogged and confirmed it: node2 forgot the only copy.

Real nodes (broker + SQLite + ClusterWiring) on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.protocol.packets import MQTT_5, Connect, Properties, Publish, Subscribe, SubscriptionRequest
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import link, start_node, stop_node, until, wiring_of
from tests.unit.broker.test_restore import RecordingLink

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _payloads(client: RecordingLink) -> list[bytes]:
    return [p.payload for p in client.sent if isinstance(p, Publish)]


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub0", 1000.0)


async def test_a_hand_over_resent_after_the_taker_started_the_session_fresh_is_merged_not_dropped(
        tmp_path: Path) -> None:
    """na owns s; nb holds no copy. na is cut off with its hand-over of s (m1, m2 queued) to nb unsent; s starts
    fresh on nb (owner unreachable, no copy anywhere) and the client subscribes again. na's hand-over, resent at the
    heal, must bring m1 and m2 into s. Before the fix nb owned s under a claim newer than the hand-over: dropped."""
    na = await start_node(tmp_path / "na", "na", ("nb",))
    nb = await start_node(tmp_path / "nb", "nb", ("na",))
    na_running = True
    try:
        await link(wiring_of(na).svc, wiring_of(nb).svc)
        wiring_of(na).svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        await until(lambda: "s" in wiring_of(nb).claims, "na's claim of s at nb")
        assert "s" not in wiring_of(nb).copies

        await stop_node(na)  # cut off with its hand-over of s to nb unsent
        na_running = False
        await until(lambda: not wiring_of(nb).svc.links.is_up("na"), "na down at nb")
        fetch = wiring_of(nb).prepare_connect("s", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS  # started fresh: no copy anywhere
        client = RecordingLink(MQTT_5)
        assert nb.broker.connect(client, Connect("s", MQTT_5, False, 60,
                                                 properties=Properties(session_expiry_interval=3600)),
                                 ReasonCode.SUCCESS) is not None
        nb.broker.handle(nb.broker.sessions["s"], client, Subscribe(1, [SubscriptionRequest("t/#", 1)]))
        await until(lambda: wiring_of(nb).claims["s"].owner == "nb", "nb's claim of s (the fresh session)")
        assert wiring_of(nb).claims["s"].epoch > 1500.0

        # na's hand-over to nb (its epoch older than nb's fresh claim), resent at the heal
        late = encode_handover(1500.0, SessionRecord("s", 3, 3600, subscriptions=dict(SUBS)),
                               [Delivery(1, _message("m1"), 1, False), Delivery(2, _message("m2"), 1, False)],
                               [], ["m1", "m2"])
        wiring_of(nb)._on_handover("na", "s", late, False, False)
        await until(lambda: _payloads(client) == [b"m1", b"m2"], "m1, m2 delivered")  # late, not lost
    finally:
        await stop_node(nb)
        if na_running:
            await stop_node(na)
