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
they held (the forwards submitted after it follow it). Chaos seed 70260, the same race in another shape, has its own
replay below.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, OP_QOS2_ADD, OP_SNAPSHOT, SessionClaim, encode_claim
from appliance.cluster.wire import SessionState, SessionTakeover
from appliance.server.node import Node
from tests.cluster.wired_node import (
    Peer,
    client_replicated_on,
    link,
    publish_qos2_on,
    start_node,
    stop_node,
    until,
    wiring_of,
)

SUBS = {"t/#": SubscriptionOptions(qos=2)}


async def _acking(peer: Peer) -> None:
    while True:
        peer.ack_replicas()
        await asyncio.sleep(0.02)





def _qos2(na: Node, msg_id: str, publisher: str, pid: int) -> None:
    """A client's QoS2 PUBLISH on t/x, reaching the one local subscriber."""
    assert publish_qos2_on(na, publisher, pid, Message(msg_id, "t/x", b"x", 2, False, publisher, 1000.0)) == 1


async def test_a_hand_over_leaves_only_once_the_publishers_replicas_hold_the_qos2_ids_of_its_queue(
        tmp_path: Path) -> None:
    """na owns p (replica nb, which lags), q (replica nc) and the offline s, queued with p's QoS2 m1 and then q's
    QoS2 m2 (q's id operation to nc is held behind p's id, as all replica operations to nc are). nc takes s over:
    the hand-over (with m1, m2) must not reach nc before nb acknowledged p's id 1, and must follow q's id operation
    on nc's stream. Before the fix it went out at once, m1's id on nb unacknowledged and m2's id unsent to nc.
    Also chaos seed 70353 (pub2#38-39 twice to sub1): p = pub2 (replica node1, lagging), s = sub1, taker node2."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    p, q, s = client_replicated_on("p", "nb"), client_replicated_on("q", "nc"), client_replicated_on("s", "nb")
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

        _qos2(na, "m1", p, 1)
        _qos2(na, "m2", q, 1)
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


async def test_a_hand_over_waits_for_every_unacknowledged_qos2_id_of_two_publishers_on_a_third_node(
        tmp_path: Path) -> None:
    """Chaos seed 70260 (batch of b17eeca: pub2#35-36 and pub3#33-34 twice to sub0, QoS2), 70012's race in another
    shape: node0 owned pub2 and pub3 (both replicated on node1, which committed slowly) and the offline sub0; node2,
    no replica of either, took sub0 over (01:38:29.372, 47 queued) while node1 held pub2's id 34 but not 35-36, and
    pub3's 31-32 but not 33-34. node0 was SIGKILLed ~0.14 s later; node2 delivered #33-#36/#29-#34 from the hand-over,
    node1 resumed pub2/pub3 without those ids and routed their DUP resends as new. Here na owns p and q (replica nb)
    and s; nb acknowledged p's and q's first ids, not their second: nc's takeover must get no hand-over until it did.
    Also chaos seed 70789 (pub2#89-91, pub3#87-89 twice to sub0): replica node2 (no PUBREC for those ids; cut off
    from node0 at 8.77-9.44), taker node1 (02:32:16.312, 20 queued), node0 SIGKILLed ~0.05 s later.
    Also chaos seed 70852 (pub2#171-175, pub3#186 twice to sub0): owner node2, replica node0, taker node1, 34 queued."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=2.0)
    wiring = wiring_of(na)
    p, q, s = client_replicated_on("p", "nb"), client_replicated_on("q", "nb"), client_replicated_on("s", "nb")
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
        await until(lambda: {r.client_id for _p, r in nb.replicated if r.op == OP_SNAPSHOT} >= {p, q, s}, "snapshots")
        nb.ack_replicas()

        def ids_at_nb() -> set[str]:
            return {r.client_id for _p, r in nb.replicated if r.op == OP_QOS2_ADD}

        _qos2(na, "p1", p, 1)
        _qos2(na, "q1", q, 1)
        await until(lambda: ids_at_nb() == {p, q}, "p's and q's first ids at nb")
        nb.ack_replicas()  # nb holds p1's and q1's ids; p2's and q2's stay unacknowledged
        _qos2(na, "p2", p, 2)
        _qos2(na, "q2", q, 2)
        await until(lambda: [d.message.msg_id for d in na.broker.sessions[s].queue] == ["p1", "q1", "p2", "q2"],
                    "s queued")

        nc.svc.send("na", SessionTakeover(7, s, "nc", False))
        await asyncio.sleep(0.3)
        assert not [m for m in nc.session_messages if isinstance(m, SessionState)], \
            "the hand-over of s (p2, q2 queued) reached nc while nb did not hold their publishers' packet ids"
        nb.ack_replicas()
        await until(lambda: [m for m in nc.session_messages if isinstance(m, SessionState)], "the hand-over at nc")
    finally:
        if acking is not None:
            acking.cancel()
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)
