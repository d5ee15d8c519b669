"""A link replaced by a newer connection (both nodes dialled each other after a heal) keeps each stream in order:
nothing written while the peer is reported down overtakes the resend of what the old link lost (chaos seed 40071,
6 acknowledged QoS1 messages lost: node0 replaced its link to node2, sub1's replica, 5 s before it was SIGKILLed; the
down report released the CONNACK and PUBACKs waiting for node2, the CONNACK's pump replicated QoS2 SENT states at
once on the new link, ahead of the resent enqueues node2 had not read on the old one; node2's receiver took that
jump for a gap the sender had released, dropped the resend as duplicates and acknowledged it all; sub1, resumed from
node2's copy after the kill, lacked pub0#244-247 and pub1#239-240).

Real node (broker + SQLite + ClusterWiring) and a bare ClusterService replica on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, OP_ENQUEUE_MANY, OP_SESSION, SessionClaim, decode_raws, encode_claim
from appliance.cluster.peerlinks import _Connection
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _enqueued(peer: Peer, cid: str) -> int:
    """Deliveries of `cid` the replica has accepted in OP_ENQUEUE_MANY operations."""
    return sum(len(decode_raws(r.data)) for _p, r in peer.replicated if r.client_id == cid and r.op == OP_ENQUEUE_MANY)


async def test_a_link_replacement_keeps_the_waits_on_the_peer_and_the_resend_first(tmp_path: Path) -> None:
    """na owns s, replicated to nr over a link nr dialled. nr stops reading it; m1 is enqueued (its replica write sits
    unread) and a write of s waits for nr's ack (in the chaos run the CONNACK, whose pump replicates QoS2 SENT
    states). na dials nr: both keep the new link (dialled by the smaller id), nr drops the old one unread, na reports
    nr down then up and resends m1 on the new link. The write waits until nr acknowledges m1: before, the down report
    released it and it went out on the new link ahead of the resend; nr dropped m1 as a duplicate and acknowledged
    it with the write."""
    node = await start_node(tmp_path / "na", "na", ("nr",))
    wiring = wiring_of(node)
    nr = Peer("nr")
    try:
        await nr.svc.async_start()
        await link(wiring.svc, nr.svc)  # nr dialled na: the link a newer one dialled by na replaces
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        adopt_session(node.broker, SessionRecord("s", 5, 3600, subscriptions=dict(SUBS)), [], [])
        await until(lambda: any(r.client_id == "s" for _p, r in nr.replicated), "s's snapshot at nr")
        nr.ack_replicas()
        await until(lambda: wiring.svc.replica_senders["nr"].in_transit == 0, "the snapshot acknowledged")

        old = nr.svc.links._peers["na"].link
        assert old is not None
        old.writer.transport.pause_reading()  # type: ignore[attr-defined]
        wiring._deliver_here(Message("m1", "t/x", b"x", 1, False, "pub", 1000.0), ("s",))
        written: list[str] = []

        def released() -> None:  # a write of s that waited for nr's ack of m1
            written.append("released")
            wiring.store.save_subscription("s", "u/#", SubscriptionOptions(qos=1))

        wiring.store.after_commit(released)
        await until(lambda: any(r.op == OP_ENQUEUE_MANY for r in wiring.svc.replica_senders["nr"].resend()),
                    "m1's replica write sent on the old link")

        reader, writer = await wiring.svc.links._async_open("127.0.0.1", nr.svc.port)  # na dials nr
        new = _Connection(wiring.svc.links, reader, writer, initiator=True, expected_peer="nr")
        task = asyncio.get_running_loop().create_task(new.async_run())
        await until(lambda: wiring.svc.links._peers["nr"].link is new, "the link replaced at na")
        await until(lambda: _enqueued(nr, "s") == 1, "m1 resent to nr on the new link")
        await asyncio.sleep(0.2)
        assert written == []  # nr has not acknowledged m1 yet

        nr.ack_replicas()
        await until(lambda: written == ["released"], "the write once nr acknowledged m1")
        await until(lambda: any(r.op == OP_SESSION for _p, r in nr.replicated if r.client_id == "s"), "it at nr")
        assert _enqueued(nr, "s") == 1
        task.cancel()
    finally:
        await nr.svc.async_stop()
        await stop_node(node)
