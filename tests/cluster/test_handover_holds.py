"""A hand-over carries a QoS2 message before its publisher's replicas hold the packet id (chaos seed 70012, batch of
main b17eeca, 4 QoS2 duplicates).

node0 owned pub2 (replica node2), pub3 (replica node1) and the offline sub0. Their QoS2 #25-#27 (client clock
2.41-2.43) were queued for sub0; node2 connected sub0 at ~2.61 and node0 answered the takeover at once with a
SessionState carrying them (63 queued). That message is sent on the link directly, not on the held streams: pub3's
replica node1 had not acknowledged id 25 (the replica holds on node2's streams waiting for it), and pub2's id
operations to node2 were still held by such holds. node0 was SIGKILLed ~0.13 s later; node2 delivered #25-#27 from
the hand-over, resumed pub2 from its copy without ids 25-27, and node1 resumed pub3 without id 25: both DUP resends
were routed as new and sub0 got pub2#25-#27 and pub3#25 twice.

Now a hand-over waits for the holds on the taker's streams placed before it, and goes after the replica operations
they held (the forwards submitted after it follow it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import MIGRATED, OP_QOS2_ADD, OP_SNAPSHOT, SessionClaim, encode_claim
from appliance.cluster.wire import SessionState, SessionTakeover
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


async def _acking(peer: Peer) -> None:
    while True:
        peer.ack_replicas()
        await asyncio.sleep(0.02)


def _pick(prefix: str, replica: str) -> str:
    return next(c for c in (f"{prefix}{n}" for n in range(200)) if rendezvous(c, ["nb", "nc"], 1) == [replica])


async def test_a_hand_over_leaves_only_once_the_publishers_replicas_hold_the_qos2_ids_of_its_queue(
        tmp_path: Path) -> None:
    """na owns p (replica nb, which lags), q (replica nc) and the offline s, queued with p's QoS2 m1 and then q's
    QoS2 m2 (q's id operation to nc is held behind p's id, as all replica operations to nc are). nc takes s over:
    the hand-over (with m1, m2) must not reach nc before nb acknowledged p's id 1, and must follow q's id operation
    on nc's stream. Before the fix it went out at once, m1's id on nb unacknowledged and m2's id unsent to nc."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    p, q, s = _pick("p", "nb"), _pick("q", "nc"), _pick("s", "nb")
    nb, nc = Peer("nb"), Peer("nc")
    acking: asyncio.Task[None] | None = None
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        acking = asyncio.get_running_loop().create_task(_acking(nc))
        for cid, subs in ((s, SUBS), (p, {}), (q, {})):
            wiring.svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(subs))))
            adopt_session(na.broker, SessionRecord(cid, 1, 3600, subscriptions=dict(subs)), [], [])
        await until(lambda: {r.client_id for _p, r in nb.replicated if r.op == OP_SNAPSHOT} >= {p, s}, "snapshots")
        await until(lambda: any(r.client_id == q and r.op == OP_SNAPSHOT for _p, r in nc.replicated), "q at nc")
        nb.ack_replicas()

        for n, publisher in ((1, p), (2, q)):  # what the broker does for a QoS2 PUBLISH
            message = Message(f"m{n}", "t/x", b"x", 2, False, publisher, 1000.0)
            na.broker.sessions[publisher].incoming_qos2[1] = None
            wiring.store.save_incoming_qos2(publisher, 1, None)
            wiring.qos2_received(message)
            reached, _persisted, chosen = na.broker.router.route(message, wiring.remote_shared("t/x"))
            wiring.route_remote(message, chosen)
            assert reached == 1
        await until(lambda: [d.message.msg_id for d in na.broker.sessions[s].queue] == ["m1", "m2"], "s queued")

        nc.svc.send("na", SessionTakeover(7, s, "nc", False))
        await asyncio.sleep(0.3)  # nb never acknowledges p's packet id 1
        assert not [m for m in nc.session_messages if isinstance(m, SessionState)], \
            "the hand-over of s (m1 queued) reached nc while p's replica did not hold m1's packet id"
        nb.ack_replicas()
        await until(lambda: [m for m in nc.session_messages if isinstance(m, SessionState)], "the hand-over at nc")
        q_ids = [r for _p, r in nc.replicated if r.client_id == q and r.op == OP_QOS2_ADD]
        assert q_ids, "the hand-over (m2 queued) reached nc ahead of q's packet id operation"
    finally:
        if acking is not None:
            acking.cancel()
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)
