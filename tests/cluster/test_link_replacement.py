"""A link replaced by a newer connection (both nodes dialled each other after a heal) keeps each stream in order:
nothing written while the peer is reported down overtakes the resend of what the old link lost (chaos seed 40071,
6 acknowledged QoS1 messages lost: node0 replaced its link to node2, sub1's replica, 5 s before it was SIGKILLed; the
down report released the CONNACK and PUBACKs waiting for node2, the CONNACK's pump replicated QoS2 SENT states at
once on the new link, ahead of the resent enqueues node2 had not read on the old one; node2's receiver took that
jump for a gap the sender had released, dropped the resend as duplicates and acknowledged it all; sub1, resumed from
node2's copy after the kill, lacked pub0#244-247 and pub1#239-240). Chaos seed 41027 (5 QoS2 duplicates, 2 sessions
lost) was the same race: the overtaking write was a stranded forward's OP_STRANDED_ADD, what the replica skipped was
the snapshots of a replica move (and with 8edb3a0 its ack of them dropped the copies the move had kept).

Real nodes (broker + SQLite + ClusterWiring) on loopback; for 40071 a bare ClusterService replica.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import MIGRATED, OP_ENQUEUE_MANY, OP_SESSION, SessionClaim, decode_raws, encode_claim
from appliance.cluster.peerlinks import _Connection
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.cluster_wiring import ClusterWiring
from appliance.server.node import Node
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



def _publish_qos2(node: Node, wiring: ClusterWiring, pub: str, msg_id: str, packet_id: int) -> None:
    """What the broker does for a QoS2 PUBLISH on t/x: the packet id first, then the routing."""
    assert node.broker is not None
    message = Message(msg_id, "t/x", b"x", 2, False, pub, 1000.0)
    node.broker.sessions[pub].incoming_qos2[packet_id] = None
    wiring.store.save_incoming_qos2(pub, packet_id, None)
    _reached, _persisted, chosen = node.broker.router.route(message, wiring.remote_shared("t/x"))
    wiring.route_remote(message, chosen)


async def _replace_link(owner: ClusterWiring, peer: ClusterWiring) -> asyncio.Task[None]:
    """The owner dials the peer: both keep that link (dialled by the smaller id) and drop the one the peer dialled."""
    reader, writer = await owner.svc.links._async_open("127.0.0.1", peer.svc.port)
    new = _Connection(owner.svc.links, reader, writer, initiator=True, expected_peer=peer.node_id)
    task = asyncio.get_running_loop().create_task(new.async_run())
    await until(lambda: owner.svc.links._peers[peer.node_id].link is new, "the link replaced at the owner")
    return task


def _stop_reading(wiring: ClusterWiring, peer: str) -> None:
    """The node stops reading its current link to `peer` (its reads lag, as after a heal's resend backlog)."""
    old = wiring.svc.links._peers[peer].link
    assert old is not None
    old.writer.transport.pause_reading()  # type: ignore[attr-defined]


SUBS2 = {"t/#": SubscriptionOptions(qos=2)}


async def test_a_qos2_publishers_snapshot_unread_on_a_replaced_link_reaches_its_replica(tmp_path: Path) -> None:
    """Chaos seed 41027 (f72f6df batch), its 5 QoS2 duplicates, reduced to two nodes: na owns the QoS2 publisher p
    (replica nb, where the subscriber s lives). nb stops reading the link it dialled with p's snapshot, packet id 1
    and m1's forward unread; na dials nb. nb must end up holding p with packet id 1, so that, na killed, p resumes
    on nb with it (its DUP resend of m1 is acknowledged without routing) and s has m1 once. With f72f6df's link
    replacement (without 8f4a2db and 06d3126) na's down report strands m1 for p's replicas: that OP_STRANDED_ADD
    goes to nb on the new link ahead of the resend, nb takes the jump for a released gap, drops the resent snapshot
    as a duplicate and acknowledges it (p's later operations find no copy and are acknowledged too); p restarts
    fresh and its DUP resend is routed as new."""
    na = await start_node(tmp_path / "na", "na", ("nb",))
    nb = await start_node(tmp_path / "nb", "nb", ("na",))
    owner, replica = wiring_of(na), wiring_of(nb)
    na_running, task = True, None
    try:
        await link(owner.svc, replica.svc)  # nb dialled na: the link a newer one dialled by na replaces
        replica.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1000.0, MIGRATED, True, dict(SUBS2))))
        adopt_session(nb.broker, SessionRecord("s", 1, 3600, subscriptions=dict(SUBS2)), [], [])
        owner.svc.put("sessions", "p", encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        await until(lambda: "s" in owner.claims and "p" in replica.claims, "the claims on both nodes")

        _stop_reading(replica, "na")
        adopt_session(na.broker, SessionRecord("p", 1, 3600), [], [])  # p's snapshot to nb
        _publish_qos2(na, owner, "p", "m1", 1)
        await until(lambda: any(f.message.msg_id == "m1" for f in owner.svc.senders["nb"].resend()),
                    "m1's forward sent on the old link")
        task = await _replace_link(owner, replica)
        await until(lambda: owner.svc.replica_senders["nb"].in_transit == 0, "p's writes acknowledged by nb")
        assert "p" in replica.copies, "nb acknowledged p's snapshot without holding it"
        assert 1 in replica.copies["p"].qos2

        await stop_node(na)  # killed with m1 in flight: p reconnects to nb
        na_running = False
        await until(lambda: not replica.svc.links.is_up("na"), "na down at nb")
        fetch = replica.prepare_connect("p", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        session = nb.broker.sessions.get("p")
        assert session is not None, "p started fresh: its DUP resend of packet id 1 is routed as new"
        assert 1 in session.incoming_qos2  # the DUP resend of m1 is acknowledged without routing
        assert [d.message.msg_id for d in nb.broker.sessions["s"].queue] == ["m1"]
    finally:
        if task is not None:
            task.cancel()
        await stop_node(nb)
        if na_running:
            await stop_node(na)


async def test_a_copy_left_by_placement_outlives_a_snapshot_lost_in_a_link_replacement(tmp_path: Path) -> None:
    """Chaos seed 41027's sequence on three nodes (na = node0, nb = node1, nc = node2). na owns the QoS2 publisher p,
    whose copy is on nc; nb (where s lives) returns and stops reading the link it dialled (the heal's resend
    backlog); m1 is routed to s (its packet id held by nc), and the rebalance moves p to nb (rendezvous), keeping
    nc's copy until nb acknowledges the snapshot (8edb3a0). Then na dials nb (the run: both replaced the link 20 ms
    after the move). nb must hold p; na killed, p reconnects to nc and resumes with packet id 1. With f72f6df's
    link replacement nb acknowledged the snapshot it skipped (see above), and with 8edb3a0 that ack dropped nc's
    kept copy too: p started fresh, as in the run (make before break needs an ack that means held)."""
    pub = next(c for c in (f"p{n}" for n in range(100)) if rendezvous(c, ["nb", "nc"], 1) == ["nb"])
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    nc = await start_node(tmp_path / "nc", "nc", ("na", "nb"))
    nb = await start_node(tmp_path / "nb", "nb", ("na", "nc"))
    owner, left, replica = wiring_of(na), wiring_of(nc), wiring_of(nb)
    na_running, task = True, None
    try:
        await link(owner.svc, left.svc)
        owner.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(na.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: pub in left.copies, "p's copy at nc")
        replica.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1000.0, MIGRATED, True, dict(SUBS2))))
        adopt_session(nb.broker, SessionRecord("s", 1, 3600, subscriptions=dict(SUBS2)), [], [])
        await link(left.svc, replica.svc)
        await until(lambda: not owner._rebalance_pending, "na's rebalance after nc's link-up")
        owner._rebalance_pending = True  # the move runs when the test calls it
        await link(owner.svc, replica.svc)  # nb dialled na
        await until(lambda: "s" in owner.claims and pub in replica.claims and "nb" in owner._live(), "nb known")

        _stop_reading(replica, "na")
        _publish_qos2(na, owner, pub, "m1", 1)
        await until(lambda: any(f.message.msg_id == "m1" for f in owner.svc.senders["nb"].resend()),
                    "m1's forward sent on the old link")
        await until(lambda: not owner._unconfirmed, "packet id 1 held by nc")
        owner._rebalance()
        assert owner.assigned[pub] == ["nb", "nc"]  # moving to nb, nc's copy kept
        task = await _replace_link(owner, replica)
        await until(lambda: owner.svc.replica_senders["nb"].in_transit == 0, "p's writes acknowledged by nb")
        assert pub in replica.copies, "nb acknowledged p's snapshot without holding it (nc's copy dropped on it)"

        await stop_node(na)  # killed with m1 in flight: p reconnects to nc
        na_running = False
        await until(lambda: not left.svc.links.is_up("na") and not replica.svc.links.is_up("na"), "na down")
        fetch = left.prepare_connect(pub, False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        session = nc.broker.sessions.get(pub)
        assert session is not None, "p started fresh: its DUP resend of packet id 1 is routed as new"
        assert 1 in session.incoming_qos2
        await until(lambda: "nb" not in left.svc.senders or left.svc.senders["nb"].in_transit == 0,
                    "a pending m1 passed on to nb")
        assert [d.message.msg_id for d in nb.broker.sessions["s"].queue] == ["m1"]
    finally:
        if task is not None:
            task.cancel()
        await stop_node(nb)
        await stop_node(nc)
        if na_running:
            await stop_node(na)
