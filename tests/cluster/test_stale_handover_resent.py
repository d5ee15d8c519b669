"""A superseded hand-over resent at a link-up was adopted by a node that did not own the session (chaos seed 100080,
batch of main 86b8ba9, 13 lost and 8 QoS2 duplicates for sub1).

node0 let sub1 go to node1 (05:20:33.341, 14 queued); node1 was killed before confirming it. sub1 resumed on node2
from a replica, then came back to node0 (39.869). node1 restarted, learnt node0's claim (44.856: closed its restored
copy), and node0 resent its old, unconfirmed hand-over at the link-up: node1 adopted it (45.312, "handed over by
node0 (14 queued)") as an offline session although the claim named node0, because the late-hand-over check only
passes a hand-over on when the newer claim's owner is a third node. When sub1 then connected to node1 (46.9), node0
let it go with pub0#308-310, pub2#194-199 and pub3#188-191 queued (held back by the QoS2 replica waits of node1's
isolation): node1 already held a session under the new claim, so the real hand-over was taken for a resend it had
and dropped (13 lost), and sub1 resumed the stale one (pub2#30-32, pub3#28-32 sent again: 8 QoS2 duplicates).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.cluster.wire import SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 2, False, "pub", 1000.0)


async def test_a_superseded_hand_over_resent_to_a_non_owner_is_not_adopted(tmp_path: Path) -> None:
    """nb owns s again (claim epoch 3000, its own earlier state up to seq 10 in the lineage) when it resends its old
    hand-over of s to na (epoch 2000: o1 RELEASED, o2 SENT). na must not install it as a session. Then s connects to
    na: nb lets s go with m3 queued (its claim for na first, the state behind). Before the fix na held the stale
    session: m3's hand-over was dropped as one it had (lost) and s resumed o2 (a QoS2 duplicate)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    nb, nc = Peer("nb"), Peer("nc")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 3000.0, MIGRATED, True, dict(SUBS),
                                                                  {"nb": 10, "nc": 12})))
        record = SessionRecord("s", 10, 3600, subscriptions=dict(SUBS))
        stale = [Delivery(3, _message("o1"), 2, False, [], 7, DeliveryState.RELEASED),
                 Delivery(4, _message("o2"), 2, False, [], 8, DeliveryState.SENT)]
        nb.svc.send("na", SessionState(0, "s", True, bytes([1]) + encode_handover(2000.0, record, stale, [], [])))
        await until(lambda: [peer.ack_replicas() for peer in (nb, nc)] and nb.done(), "na's SessionDone for it")
        stale_adopted = "s" in na.broker.sessions

        fetch = wiring.prepare_connect("s", False)  # s connects to na: ask nb
        assert fetch is not None
        task = asyncio.ensure_future(fetch)
        await until(lambda: [m for m in nb.session_messages if isinstance(m, SessionTakeover)], "the question")
        [ask] = [m for m in nb.session_messages if isinstance(m, SessionTakeover)]
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 4000.0, MIGRATED, True, dict(SUBS),
                                                                  {"nc": 12, "nb": 13})))
        await until(lambda: wiring.claims["s"].owner == "na", "nb's claim for na")
        fresh = [Delivery(12, _message("m3"), 2, False)]
        nb.svc.send("na", SessionState(ask.request_id, "s", True,
                                       bytes([1]) + encode_handover(4000.0, record, fresh, [], [])))
        assert await asyncio.wait_for(task, 10) == ReasonCode.SUCCESS
        session = na.broker.sessions["s"]
        held = [d.message.msg_id for d in sorted([*session.inflight.values(), *session.queue], key=lambda d: d.seq)]
        assert held == ["m3"], f"s holds {held} (stale hand-over adopted: {stale_adopted}): m3 lost, o2 sent twice"
        assert nb.received == [], "nb's own lineage held o2: nothing to pass back"
    finally:
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)
