"""A minority side acknowledges no publish that it could keep on its own disk only (chaos seed 30625, reordered):
node0, isolated, released pub0's PUBACKs for sub0 (owned by node2) when its links were declared down, with pub0's
replicas unreachable too (allow_publish = true, under_replicated = "accept"); it was SIGKILLed 0.8 s after the
heal, before its link to node2 was back. pub0 resumed elsewhere from a copy without those messages ("0 stranded
passed on"), and they reached sub0 9 s later, after node0 restarted, behind newer ones (A D E B C).

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers, on loopback; clients on in-memory links.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.broker.broker import BrokerError
from appliance.broker.model import SubscriptionOptions
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import FRESH, SessionClaim, encode_claim
from appliance.protocol.packets import (
    MQTT_5,
    Connect,
    Properties,
    Puback,
    Publish,
    Pubrec,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.node import Node
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of
from tests.unit.broker.test_restore import RecordingLink

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _claim_remote(node: Node, cid: str, owner: str) -> None:
    """A persistent subscriber `cid` of t/# owned by `owner`, as its claim would arrive."""
    wiring_of(node).svc.put("sessions", cid, encode_claim(SessionClaim(owner, 1000.0, FRESH, True, dict(SUBS))))


def _connect(node: Node, cid: str, version: int = MQTT_5) -> RecordingLink:
    client = RecordingLink(version)
    props = Properties(session_expiry_interval=3600) if version == MQTT_5 else Properties()
    session = node.broker.connect(client, Connect(cid, version, version != MQTT_5, 60, properties=props),
                                  ReasonCode.SUCCESS)
    assert session is not None
    return client


def _acks(client: RecordingLink) -> list[tuple[int, int]]:
    return [(p.packet_id, p.reason_code) for p in client.sent if isinstance(p, Puback | Pubrec)]


async def _with_replicas(peers: tuple[Peer, ...], predicate: Callable[[], object], what: str) -> None:
    """Wait for predicate() while the peers acknowledge every replica operation they get (their commits)."""
    for _ in range(200):
        for peer in peers:
            peer.ack_replicas()
        if predicate():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


async def test_an_isolated_node_refuses_a_publish_it_could_keep_on_its_own_disk_only(tmp_path: Path) -> None:
    """na knows nb and nc, reaches neither (a minority side); s is owned by nb. A QoS1 / QoS2 publish for s would
    rest on na's disk only (s's node and pub's replicas are unreachable): v5 PUBACK / PUBREC 0x83, 3.1.1 closes
    the connection without an ack. A publish no persistent session waits for is still acknowledged. Before the
    fix: PUBACK 0x00 (allow_publish = true and under_replicated = "accept" let it go)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    try:
        pub = _connect(na, "pub")
        await until(lambda: pub.sent, "pub's CONNACK")
        na.broker.handle(na.broker.sessions["pub"], pub, Publish("u/x", b"nobody waits", 1, packet_id=1))
        await until(lambda: _acks(pub), "the PUBACK of a message no session waits for")
        _claim_remote(na, "s", "nb")
        session = na.broker.sessions["pub"]
        na.broker.handle(session, pub, Publish("t/x", b"m1", 1, packet_id=2))
        na.broker.handle(session, pub, Publish("t/x", b"m2", 2, packet_id=3))
        await until(lambda: len(_acks(pub)) == 3, "the answers to m1 and m2")
        assert _acks(pub) == [(1, ReasonCode.NO_MATCHING_SUBSCRIBERS), (2, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR),
                              (3, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)]
        assert not wiring_of(na).svc.senders.get("nb") or wiring_of(na).svc.senders["nb"].in_transit == 0
        old = _connect(na, "old", version=4)
        with pytest.raises(BrokerError):  # the connection closes (ClientConnection._fail): the client resends
            na.broker.handle(na.broker.sessions["old"], old, Publish("t/x", b"m3", 1, packet_id=1))
        assert not _acks(old)
    finally:
        await stop_node(na)


async def test_a_majority_side_still_acknowledges_a_publish_for_a_node_that_is_down(tmp_path: Path) -> None:
    """na reaches nc (two of three: not a minority); s's node nb is down. The message waits in the durable
    in-transit buffer (and pub's replicas, when it has them): PUBACK 0x00 as before."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    nc = Peer("nc")
    try:
        await nc.svc.async_start()
        await link(wiring_of(na).svc, nc.svc)
        _claim_remote(na, "s", "nb")
        pub = _connect(na, "pub")
        await _with_replicas((nc,), lambda: pub.sent, "pub's CONNACK")
        na.broker.handle(na.broker.sessions["pub"], pub, Publish("t/x", b"m1", 1, packet_id=1))
        await _with_replicas((nc,), lambda: _acks(pub), "m1's PUBACK")
        assert _acks(pub) == [(1, ReasonCode.SUCCESS)]
    finally:
        await nc.svc.async_stop()
        await stop_node(na)


async def test_an_ack_in_flight_when_the_node_becomes_a_minority_waits_for_the_target(tmp_path: Path) -> None:
    """The seed's path: m1 for s (owned by nb) is forwarded while nb and nc are up; nb does not acknowledge it
    before both links drop (na isolated). The PUBACK must not go out on na's disk alone when the links are declared
    down; it goes out once nb is back and has the message. Before the fix it went out at the peer-down."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    nb, nc = Peer("nb"), Peer("nc")
    at_nb: list[str] = []
    nb.svc.cb.on_forward = lambda _p, fwd: at_nb.append(fwd.message.msg_id)  # received, never committed
    wiring = wiring_of(na)
    back = Peer("nb")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        _claim_remote(na, "s", "nb")
        pub = _connect(na, "pub")
        await _with_replicas((nb, nc), lambda: pub.sent, "pub's CONNACK")
        na.broker.handle(na.broker.sessions["pub"], pub, Publish("t/x", b"m1", 1, packet_id=1))
        await until(lambda: at_nb, "m1 at nb")
        await nc.svc.async_stop()  # nb, still heard from, makes two of three: not a minority yet
        await until(lambda: not wiring.svc.links.is_up("nc"), "nc down")
        await nb.svc.async_stop()
        await until(lambda: not wiring.svc.links.up_peers(), "na isolated")
        await asyncio.sleep(0.3)
        assert _acks(pub) == []  # m1 is on na's disk only: no PUBACK
        await back.svc.async_start()
        await link(wiring.svc, back.svc)  # the buffered forward is resent and committed at nb
        await until(lambda: _acks(pub), "m1's PUBACK once nb has it")
        assert _acks(pub) == [(1, ReasonCode.SUCCESS)] and back.received
    finally:
        await back.svc.async_stop()
        await stop_node(na)



async def test_a_stranded_message_goes_to_a_reachable_replica_when_the_publishers_was_on_the_down_node(
        tmp_path: Path) -> None:
    """The re-run of seed 30625: node0 got a majority back (node2 returned) while node1 stayed down; the acks held
    for node1's forwards were released by stranding them on pub0's replicas, but pub0's replica was node1 itself:
    on node0's disk alone again, and node0 was killed before node1 returned. Here nb holds s and pub's replica and
    goes down while nc stays up: the stranded message must reach pub's new replica (nc) before the PUBACK. Before
    the fix the PUBACK went out at once."""
    pub_id = next(c for c in (f"pub{n}" for n in range(50)) if rendezvous(c, ["nb", "nc"], 1) == ["nb"])
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    nb, nc = Peer("nb"), Peer("nc")
    at_nb: list[str] = []
    nb.svc.cb.on_forward = lambda _p, fwd: at_nb.append(fwd.message.msg_id)  # received, never committed
    wiring = wiring_of(na)
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        _claim_remote(na, "s", "nb")
        pub = _connect(na, pub_id)
        await _with_replicas((nb, nc), lambda: pub.sent, "pub's CONNACK")
        assert wiring.assigned[pub_id] == ["nb"]
        na.broker.handle(na.broker.sessions[pub_id], pub, Publish("t/x", b"m1", 1, packet_id=1))
        await until(lambda: at_nb, "m1 at nb")
        await nb.svc.async_stop()
        await until(lambda: not wiring.svc.links.is_up("nb"), "nb down")
        await until(lambda: [r for _p, r in nc.replicated if r.client_id == pub_id], "pub re-replicated to nc")
        await asyncio.sleep(0.2)
        assert _acks(pub) == []  # m1 is on na's disk only until nc acknowledges
        held = [r for _p, r in nc.replicated if r.client_id == pub_id]
        assert any(at_nb[0].encode() in r.data for r in held)  # the snapshot or the stranded entry carries m1
        await _with_replicas((nc,), lambda: _acks(pub), "m1's PUBACK once nc holds it")
        assert _acks(pub) == [(1, ReasonCode.SUCCESS)]
    finally:
        await nc.svc.async_stop()
        await stop_node(na)


async def test_an_enqueue_whose_replica_goes_down_waits_for_the_sessions_new_replica(tmp_path: Path) -> None:
    """A second re-run of seed 30625: node0, back to a majority, released the acks that waited for an enqueue of
    its own subscriber sub0 to sub0's replica (node2, still down); the queue copy was to be rebuilt on node1 by the
    next rebalance, but node0 was killed first and sub0, resumed on node2, got the messages after newer ones. Here
    s (local to na) has its replica on nb, which goes down while nc stays up: the PUBACK waits for s's snapshot on
    nc. Before the fix it went out at nb's peer-down."""
    sub_id = next(c for c in (f"sub{n}" for n in range(50)) if rendezvous(c, ["nb", "nc"], 1) == ["nb"])
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    nb, nc = Peer("nb"), Peer("nc")
    wiring = wiring_of(na)
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        sub = _connect(na, sub_id)
        await _with_replicas((nb, nc), lambda: sub.sent, "sub's CONNACK")
        na.broker.handle(na.broker.sessions[sub_id], sub, Subscribe(1, [SubscriptionRequest("t/#", 1)]))
        await _with_replicas((nb, nc), lambda: any(isinstance(p, Suback) for p in sub.sent), "sub's SUBACK")
        assert wiring.assigned[sub_id] == ["nb"]
        na.broker.connection_lost(na.broker.sessions[sub_id], sub)  # offline: m1 stays queued
        pub = _connect(na, "pub", version=4)  # a clean 3.1.1 publisher: no replicas of its own
        await until(lambda: pub.sent, "pub's CONNACK")
        seen = len(nb.replicated)
        na.broker.handle(na.broker.sessions["pub"], pub, Publish("t/x", b"m1", 1, packet_id=1))
        await until(lambda: len(nb.replicated) > seen, "m1's enqueue at nb (never acknowledged)")
        await nb.svc.async_stop()
        await until(lambda: not wiring.svc.links.is_up("nb"), "nb down")
        await until(lambda: [r for _p, r in nc.replicated if r.client_id == sub_id], "s re-replicated to nc")
        await asyncio.sleep(0.2)
        assert _acks(pub) == []  # m1 is in s's queue on na's disk only until nc acknowledges the snapshot
        await _with_replicas((nc,), lambda: _acks(pub), "m1's PUBACK once nc holds s")
        assert _acks(pub) == [(1, ReasonCode.SUCCESS)]
    finally:
        await nc.svc.async_stop()
        await stop_node(na)
