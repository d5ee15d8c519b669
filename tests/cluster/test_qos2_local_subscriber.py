"""A QoS2 message reaches a local subscriber's replica before its publisher's replica holds the packet id (chaos seed
41004, f72f6df batch, 2 QoS2 duplicates; the "local subscriber's replica" limit of the pending-messages notes).

node0 owned pub2 (replica node1) and sub1 (replica node2), both local. node1 had just been isolated: its link
expired at 21:56:58.506, came back at 58.520 and node0 resent ~2 s of buffered forwards and replica operations on it;
the re-replication of pub2 at the link drop (to node2) was moved back to node1 by the rebalance at ~58.71. pub2's
QoS2 #110 and #111 arrived at node0 at ~59.04 (client clock 5.31): node0 stored the packet ids (OP_QOS2_ADD to
node1) and queued both for sub1, whose replica write and outbound SENT state (packet ids 445, 446) reached node2.
node0 was SIGKILLed ~50 ms later (peers: reset at 59.097/59.098); node1 had not applied the packet ids (its reads
lagged the resend backlog; the reset discards unread bytes). node1 resumed pub2 "from a replica (0 queued, 0 stranded
passed on)" at 59.420 and routed pub2's DUP resend of #110/#111 as new (new message ids); node2 resumed sub1 at
59.462 with #110/#111 in flight: sub1 got them with DUP (pids 445/446, 5.759) and again as new (pids 21/22, 5.786).

The forwards of a QoS2 message waited for its publisher's replicas (the QoS2 barrier); the local sessions' replica
writes did not (replica streams were never held: two publishers with different replicas would hold each other's
packet ids back). Now the replica streams to the other peers are held too, from just after the packet id went out
(a hold never covers the operation another hold waits for).

Chaos seed 43042 (db3a539 batch, 1 QoS2 duplicate) is the same race with the subscriber online: node2 owned pub2
(replica node1) and sub1 (replica node0), sub1 connected with room in its window. pub2's QoS2 #45 (client clock
4.065) was queued for sub1 and sent at once: the pump's SENT state (packet id 141) flushed sub1's batched enqueue to
node0 and went out with it inside the local routing, before route_remote submitted the packet id to node1 and
placed the replica holds behind it, so nothing held them. node2 was SIGKILLed ~0.15 s later (links reset at
23:41:22.901) with node1, its acks lagging (pub2's PUBRECs took 0.1-0.3 s), not holding #45-#51's ids: pub2
resumed on node1 "(0 queued, 1 stranded passed on)" (#44) and its DUP resend of #45-#51 was routed as new; sub1
resumed on node1 from node0's copy got #45 under DUP packet id 141 (4.621) and again as new under 16 (4.679).
Now the replica holds of a client's QoS2 PUBLISH are placed when its packet id is stored, before the local routing
(its packet-id operation follows within the same call, so a hold still never covers an operation another hold
waits for).
Chaos seed 60143 (6b767b4 batch) is that race again, replayed end to end by the last test: node2 owned pub3
(replica node0, its acks lagging 0.2-0.35 s) and the online sub0 (replica node1); sub0 got pub3#48 from node1's
copy (DUP, packet id 151) and again as new (38) from pub3's resend, routed on node0 without id 48.

Chaos seed 60051 (on 6b767b4, before the fix): when the subscriber's replica is the publisher's too, the local
routing's writes (the subscriber's enqueue and SENT state) went out on that one stream ahead of the packet id; a
replica whose reads stopped between them (the owner killed then) resumed the subscriber with the message and the
publisher without its id, whose DUP resend was routed as new. Now the broker hands the id and the message to the
cluster (ClusterPort.qos2_received) right after storing the id, before the local routing.

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers on loopback; clients on in-memory links.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.broker.handover import adopt_session
from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, OP_SNAPSHOT, SessionClaim, encode_claim
from appliance.cluster.wire import Replicate
from appliance.protocol.packets import (
    MQTT_5,
    Connect,
    Properties,
    Publish,
    Pubrec,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.node import Node
from tests.cluster.wired_node import Peer, client_replicated_on, link, start_node, stop_node, until, wiring_of
from tests.unit.broker.test_restore import RecordingLink

SUBS = {"t/#": SubscriptionOptions(qos=2)}


async def _acking(peer: Peer) -> None:
    while True:
        peer.ack_replicas()
        await asyncio.sleep(0.02)


async def test_a_local_subscribers_replica_gets_a_qos2_message_only_after_the_publishers_replica_has_its_id(
        tmp_path: Path) -> None:
    """na owns pub (replica nb, which has not applied pub's packet id 1: its reads lag) and s (replica nc). pub's
    QoS2 m1 is routed to s on na. nc must not learn m1 before nb acknowledged packet id 1: killed in between, na
    leaves s resumable with m1 while pub resumes without the id and its DUP resend is routed as new."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    pub = client_replicated_on("p", "nb")
    sub = client_replicated_on("s", "nc")
    nb, nc = Peer("nb"), Peer("nc")
    acking: asyncio.Task[None] | None = None
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        acking = asyncio.get_running_loop().create_task(_acking(nc))
        wiring.svc.put("sessions", sub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(na.broker, SessionRecord(sub, 1, 3600, subscriptions=dict(SUBS)), [], [])
        adopt_session(na.broker, SessionRecord(pub, 1, 3600), [], [])
        await until(lambda: any(r.client_id == pub and r.op == OP_SNAPSHOT for _p, r in nb.replicated),
                    "pub's snapshot at nb")
        await until(lambda: any(r.client_id == sub and r.op == OP_SNAPSHOT for _p, r in nc.replicated),
                    "s's snapshot at nc")
        nb.ack_replicas()
        before = len([r for _p, r in nc.replicated if r.client_id == sub])

        message = Message("m1", "t/x", b"x", 2, False, pub, 1000.0)
        na.broker.sessions[pub].incoming_qos2[1] = None  # what the broker does for a QoS2 PUBLISH: the id first
        wiring.store.save_incoming_qos2(pub, 1, None)
        wiring.qos2_received(message)
        reached, _persisted, chosen = na.broker.router.route(message, wiring.remote_shared("t/x"))
        wiring.route_remote(message, chosen)
        assert reached == 1
        await asyncio.sleep(0.3)  # nb never acknowledges packet id 1
        assert not [r for _p, r in nc.replicated if r.client_id == sub][before:], \
            "s's replica learnt m1 while pub's replica did not hold its packet id"
        nb.ack_replicas()
        await until(lambda: [r for _p, r in nc.replicated if r.client_id == sub][before:], "m1 at nc once nb has id 1")
    finally:
        if acking is not None:
            acking.cancel()
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)


def _connect(node: Node, cid: str) -> RecordingLink:
    client = RecordingLink(MQTT_5)
    connect = Connect(cid, MQTT_5, False, 60, properties=Properties(session_expiry_interval=3600))
    assert node.broker.connect(client, connect, ReasonCode.SUCCESS) is not None
    return client


async def _with_replicas(peers: tuple[Peer, ...], predicate: Callable[[], object], what: str) -> None:
    """Wait for predicate() while the peers acknowledge every replica operation they get (their commits)."""
    deadline = time.monotonic() + 30.0  # generous: a loaded 2-core machine, never a pass/fail timing
    while time.monotonic() < deadline:
        for peer in peers:
            peer.ack_replicas()
        if predicate():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


async def test_an_online_local_subscriber_gets_a_qos2_message_only_after_the_publishers_replica_has_its_id(
        tmp_path: Path) -> None:
    """Chaos seed 43042: as above, but s is connected with room in its window, so m1 is sent to it at once (its SENT
    state, packet id and all, goes to nc with the enqueue, inside the local routing). nc must learn neither before
    nb acknowledged pub's packet id 1, and s gets the PUBLISH only after both. Before the fix nc got the enqueue
    and the SENT state at once and s the PUBLISH once nc acknowledged, nb holding nothing."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    pub_id = client_replicated_on("p", "nb")
    sub_id = client_replicated_on("s", "nc")
    nb, nc = Peer("nb"), Peer("nc")
    acking: asyncio.Task[None] | None = None
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        sub = _connect(na, sub_id)
        await _with_replicas((nb, nc), lambda: sub.sent, "s's CONNACK")
        na.broker.handle(na.broker.sessions[sub_id], sub, Subscribe(1, [SubscriptionRequest("t/#", 2)]))
        await _with_replicas((nb, nc), lambda: any(isinstance(p, Suback) for p in sub.sent), "s's SUBACK")
        pub = _connect(na, pub_id)
        await _with_replicas((nb, nc), lambda: pub.sent, "pub's CONNACK")
        assert wiring.assigned == {sub_id: ["nc"], pub_id: ["nb"]}
        before = len([r for _p, r in nc.replicated if r.client_id == sub_id])
        sub.take()
        acking = asyncio.get_running_loop().create_task(_acking(nc))  # nc commits what it gets; nb lags

        na.broker.handle(na.broker.sessions[pub_id], pub, Publish("t/x", b"m1", 2, packet_id=1))
        await asyncio.sleep(0.3)  # nb never acknowledges packet id 1
        assert not [r for _p, r in nc.replicated if r.client_id == sub_id][before:], \
            "s's replica learnt m1 (queued and in flight) while pub's replica did not hold its packet id"
        assert not [p for p in sub.sent if isinstance(p, Publish)]
        nb.ack_replicas()
        await until(lambda: [p for p in sub.sent if isinstance(p, Publish)], "m1 sent to s once nb has id 1")
        assert [(p.payload, p.packet_id, p.dup) for p in sub.sent if isinstance(p, Publish)] == [(b"m1", 1, False)]
    finally:
        if acking is not None:
            acking.cancel()
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)


async def _resumed_from(data_dir: Path, ops: list[Replicate], claims: dict[str, SessionClaim], sub_id: str,
                        pub_id: str) -> list[tuple[int | None, bool]]:
    """A real node nb that applied `ops` of na's replica stream (na dead, its later operations never read) resumes s
    and pub from its copies; pub resends m1 (DUP, packet id 1). Return m1's PUBLISHes to s: (packet id, dup)."""
    nb = await start_node(data_dir, "nb", ("na",), failure_timeout=1.0)
    wiring = wiring_of(nb)
    try:
        for cid, claim in claims.items():
            wiring.svc.put("sessions", cid, encode_claim(claim))
        for rep in ops:
            wiring._on_replicate("na", rep)
        links = {}
        for cid in (sub_id, pub_id):  # s first: pub's pending message (if its copy has one) is passed on to it
            fetch = wiring.prepare_connect(cid, False)
            assert fetch is not None and await fetch == ReasonCode.SUCCESS
            links[cid] = _connect(nb, cid)
        pub = links[pub_id]
        nb.broker.handle(nb.broker.sessions[pub_id], pub, Publish("t/x", b"m1", 2, dup=True, packet_id=1))
        await until(lambda: any(isinstance(p, Pubrec) for p in pub.sent), "the PUBREC of pub's resend")

        def copies() -> list[tuple[int | None, bool]]:
            return [(p.packet_id, p.dup) for p in links[sub_id].sent if isinstance(p, Publish) and p.payload == b"m1"]

        await until(copies, "m1's first PUBLISH to s")  # s must get it at least once, however slow the machine
        await asyncio.sleep(0.3)  # a second copy, routed as new, goes out at once
        return copies()
    finally:
        await stop_node(nb)


async def test_a_replica_shared_by_publisher_and_online_subscriber_resumes_them_with_one_copy_wherever_it_stopped(
        tmp_path: Path) -> None:
    """na owns pub and s (online, room in its window), both replicated on nb, the only other member. pub's QoS2 m1
    (packet id 1) goes to s on na; nb acknowledges nothing after it. na dies: for every point where nb's reads of
    na's replica stream may have stopped, nb resumes s and pub from what it applied and pub resends m1 (DUP): s must
    get m1 exactly once. Before the fix the local routing's writes (s's enqueue and SENT state) preceded pub's
    packet id on that stream: stopped between them, s resumed with m1 in flight and pub without its id, so the
    resend was routed as new (s got m1 twice)."""
    na = await start_node(tmp_path / "na", "na", ("nb",), failure_timeout=1.0)
    wiring = wiring_of(na)
    nb = Peer("nb")
    na_running = True
    try:
        await nb.svc.async_start()
        await link(wiring.svc, nb.svc)
        sub = _connect(na, "s")
        await _with_replicas((nb,), lambda: sub.sent, "s's CONNACK")
        na.broker.handle(na.broker.sessions["s"], sub, Subscribe(1, [SubscriptionRequest("t/#", 2)]))
        await _with_replicas((nb,), lambda: any(isinstance(p, Suback) for p in sub.sent), "s's SUBACK")
        pub = _connect(na, "pub")
        await _with_replicas((nb,), lambda: pub.sent, "pub's CONNACK")
        assert wiring.assigned == {"s": ["nb"], "pub": ["nb"]}
        await asyncio.sleep(0.1)
        before = len(nb.replicated)

        na.broker.handle(na.broker.sessions["pub"], pub, Publish("t/x", b"m1", 2, packet_id=1))
        await until(lambda: {rep.client_id for _p, rep in nb.replicated[before:]} >= {"s", "pub"},
                    "na's writes for s and pub after m1")
        await asyncio.sleep(0.3)  # nb applies nothing more (its reads stop somewhere in what follows)
        ops = [rep for _p, rep in nb.replicated]
        claims = {cid: wiring.claims[cid] for cid in ("s", "pub")}
        assert {rep.client_id for rep in ops[before:]} == {"s", "pub"}
        await nb.svc.async_stop()
        await stop_node(na)  # killed: nb never reads the rest
        na_running = False

        got = {}
        for cut in range(before, len(ops) + 1):
            got[cut - before] = await _resumed_from(tmp_path / f"nb{cut}", ops[:cut], claims, "s", "pub")
        assert all(len(copies) == 1 for copies in got.values()), \
            f"m1's PUBLISHes to s (packet id, dup) by the number of na's operations after pub's PUBLISH nb applied, " \
            f"of {[(rep.client_id, rep.op) for rep in ops[before:]]}: {got}"
    finally:
        await nb.svc.async_stop()
        if na_running:
            await stop_node(na)


async def test_an_owner_killed_while_the_publishers_replica_lags_leaves_the_online_subscriber_one_copy(
        tmp_path: Path) -> None:
    """Chaos seed 60143 (6b767b4 batch, pub3#48 twice to sub0), end to end: na owns pub (replica nb, its acks
    lagging) and the online s (replica nc). pub's QoS2 m1 (packet id 1) goes to s; na dies before nb applied the id.
    s resumes from nc's copy, pub from nb's (merged here into one real node), and pub resends m1 (DUP): s must get
    m1 once. Before 997c23a nc had s's enqueue and SENT state (s resumed with m1 in flight, DUP) while pub resumed
    without id 1, so its resend was routed as new: s got m1 twice."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    pub_id = client_replicated_on("p", "nb")
    sub_id = client_replicated_on("s", "nc")
    nb, nc = Peer("nb"), Peer("nc")
    acking: asyncio.Task[None] | None = None
    na_running = True
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        sub = _connect(na, sub_id)
        await _with_replicas((nb, nc), lambda: sub.sent, "s's CONNACK")
        na.broker.handle(na.broker.sessions[sub_id], sub, Subscribe(1, [SubscriptionRequest("t/#", 2)]))
        await _with_replicas((nb, nc), lambda: any(isinstance(p, Suback) for p in sub.sent), "s's SUBACK")
        pub = _connect(na, pub_id)
        await _with_replicas((nb, nc), lambda: pub.sent, "pub's CONNACK")
        assert wiring.assigned == {sub_id: ["nc"], pub_id: ["nb"]}
        await asyncio.sleep(0.1)
        nb.ack_replicas()
        applied_by_nb = len(nb.replicated)  # nb's reads stop here: it never applies pub's packet id 1
        acking = asyncio.get_running_loop().create_task(_acking(nc))  # nc commits everything it gets

        na.broker.handle(na.broker.sessions[pub_id], pub, Publish("t/x", b"m1", 2, packet_id=1))
        await asyncio.sleep(0.3)
        acking.cancel()
        ops = [rep for _p, rep in nb.replicated[:applied_by_nb]] + [rep for _p, rep in nc.replicated]
        claims = {cid: wiring.claims[cid] for cid in (sub_id, pub_id)}
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)  # killed
        na_running = False

        got = await _resumed_from(tmp_path / "resumed", ops, claims, sub_id, pub_id)
        assert len(got) == 1, f"m1's PUBLISHes to s after the failover (packet id, dup): {got}"
    finally:
        if acking is not None:
            acking.cancel()
        for peer in (nb, nc):
            await peer.svc.async_stop()
        if na_running:
            await stop_node(na)
