"""An owner continued after SIGSTOP must not act on what its links delivered while it was frozen (chaos seeds 30585,
30675, QoS2 duplicates): node2 owned sub0 and was SIGSTOPped; sub0 connected to node0, whose takeover question
reached node2's socket; node0's link to node2 timed out (no answer: CONNACK 0x88, retry); sub0 resumed on node1 from
node1's replica and completed QoS2 flows there (PUBREL, PUBCOMP). After SIGCONT node2 read the buffered question,
handed sub0 to node0 under a claim newer than node1's and with its stale state (the QoS2 deliveries node1 had
completed still SENT): node1 lost its claim, and sub0 got those messages again (DUP, same packet ids, after their
PUBCOMP). Bytes a link reads after it expired by our own clock are dropped with the link: the peer has given up on
it (and resent what it must on the next link); the continued owner then learns the newer claim and loses.

Real nodes (broker + SQLite + ClusterWiring) and real ClusterServices as the other peers, on loopback.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, SessionClaim, encode_claim
from appliance.cluster.wire import SessionState, SessionTakeover
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}
FAILURE_TIMEOUT = 1.0


async def test_a_takeover_question_read_after_the_link_expired_is_not_answered(tmp_path: Path) -> None:
    """na owns s (a QoS2 delivery SENT under packet id 7). nb's takeover question for s reaches na's socket, then
    na freezes for longer than failure_timeout (the whole loop is blocked: SIGSTOP). At SIGCONT na must not hand s
    over on that question (nb gave up on it; another node may have resumed s meanwhile): s stays na's and nb gets
    no SessionState. Before the fix na read the question before noticing the link had expired, let s go to nb
    and wrote nb's claim with its stale state."""
    na = await start_node(tmp_path / "na", "na", ("nb",), failure_timeout=FAILURE_TIMEOUT)
    asker = Peer("nb")
    wiring = wiring_of(na)
    try:
        await asker.svc.async_start()
        await link(wiring.svc, asker.svc)
        message = Message("m1", "t/x", b"x", 2, False, "pub", 1000.0)
        adopt_session(na.broker, SessionRecord("s", 2, 3600, subscriptions=dict(SUBS)),
                      [Delivery(1, message, 2, False, packet_id=7, state=DeliveryState.SENT)], [])
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, FRESH, True, dict(SUBS))))

        asker.svc.send("na", SessionTakeover(3, "s", "nb", False))
        await asyncio.sleep(0)  # the question is written to na's socket, not read yet
        loop = asyncio.get_running_loop()
        limit, loop.slow_callback_duration = loop.slow_callback_duration, 10.0  # the block below is the point
        time.sleep(FAILURE_TIMEOUT * 1.5)  # na frozen (SIGSTOP) with the question in its socket buffer
        await asyncio.sleep(0)
        loop.slow_callback_duration = limit
        await until(lambda: not wiring.svc.links.is_up("nb") or "s" not in na.broker.sessions,
                    "na noticing its expired link")
        await link(wiring.svc, asker.svc)  # the peers link up again (na redials)
        await asyncio.sleep(0.2)
        assert "s" in na.broker.sessions
        assert wiring.claims["s"].owner == "na"
        assert not [m for m in asker.session_messages if isinstance(m, SessionState)]
    finally:
        await asker.svc.async_stop()
        await stop_node(na)
