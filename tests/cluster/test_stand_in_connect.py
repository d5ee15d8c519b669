"""A CONNECT for a session whose claim names this node before its hand-over has come, the old owner unreachable
(chaos seed 70533, 89 acknowledged messages lost, session present = 0 for a persistent subscriber): node1 asked
node0 for sub2 just as node0 was isolated; node0 let sub2 go and wrote node1's claim, which node2 relayed to node1,
while the hand-over was stuck on the dead link. node1's ask ended without an answer (CONNECT refused, retry), and
the claim made node1 await node0's hand-over, routing sub2's messages to node0 (74 forwards buffered there). The
retried CONNECT found the old owner unreachable and got a brand-new session from the broker: no subscriptions, so
the buffered forwards retargeted into it matched nothing and were dropped, and the CONNACK said session present = 0.

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers, on loopback; the client on an
in-memory link through the broker's own CONNECT.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.cluster.wire import SessionState
from appliance.protocol.packets import MQTT_5, Connack, Connect, Properties, Publish
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.node import Node
from tests.cluster.wired_node import Peer, link, start_node, stop_node, wiring_of
from tests.unit.broker.test_restore import RecordingLink

SUBS = {"t/#": SubscriptionOptions(qos=1)}
FROM_OWNER = bytes([1])


def _message(msg_id: str, n: int) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub", 1000.0 + n)


def _payloads(client: RecordingLink) -> list[bytes]:
    return [p.payload for p in client.sent if isinstance(p, Publish)]


async def _replicated(replica: Peer, predicate: Callable[[], object], what: str) -> None:
    """Wait for predicate() while the replica acknowledges every replica operation it gets (its commits)."""
    for _ in range(500):
        replica.ack_replicas()
        if predicate():
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


async def connect_persistent(node: Node, relay: Peer) -> RecordingLink:
    """Client s connects to `node` after its fetch (clean start 0, session expiry 1 h): CONNACK success, session
    present."""
    client = RecordingLink(MQTT_5)
    session = node.broker.connect(client, Connect("s", MQTT_5, False, 60,
                                                  properties=Properties(session_expiry_interval=3600)),
                                  ReasonCode.SUCCESS)
    assert session is not None
    await _replicated(relay, lambda: any(isinstance(p, Connack) for p in client.sent), "CONNACK")
    connack = next(p for p in client.sent if isinstance(p, Connack))
    assert connack.reason_code == ReasonCode.SUCCESS and connack.session_present
    return client


async def test_a_connect_while_the_hand_over_is_awaited_from_an_unreachable_owner_keeps_the_session(
        tmp_path: Path) -> None:
    """n1 holds the claim of s (relayed by n2) but not n0's hand-over, n0 unreachable; m2, published on n1
    meanwhile, is buffered for n0. The client's CONNECT (clean start 0) gets the session from its claim: session
    present = 1, its subscriptions, m2 delivered; n0's hand-over (m1), resent at its return, joins it (late, not
    lost). Before the fix the broker made a new session without subscriptions: m2, retargeted into it, matched
    nothing and was dropped, and the CONNACK said session present = 0."""
    n1 = await start_node(tmp_path / "n1", "n1", ("n0", "n2"))
    old_owner, relay = Peer("n0"), Peer("n2")
    wiring = wiring_of(n1)
    try:
        await relay.svc.async_start()
        await link(wiring.svc, relay.svc)  # n1 reaches half of the members: not a minority side
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n0", 1000.0, FRESH, True, dict(SUBS))))
        wiring.route_remote(_message("m0", 0), [])  # routed to n0 while it owned s: buffered (n0 unreachable)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n0": 2})))
        assert wiring.claims["s"].owner == "n1" and "s" not in n1.broker.sessions
        wiring.route_remote(_message("m2", 2), [])  # published meanwhile: buffered for n0 (its hand-over awaited)

        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None and await fetch == ReasonCode.SUCCESS
        client = await connect_persistent(n1, relay)
        assert dict(n1.broker.sessions["s"].record.subscriptions) == SUBS
        await _replicated(relay, lambda: len(_payloads(client)) >= 2, "m0 and m2 delivered")
        assert _payloads(client) == [b"m0", b"m2"]  # buffered for n0, not dropped

        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        state = encode_handover(2000.0, record, [Delivery(1, _message("m1", 1), 1, False)], [], ["m1"])
        old_owner.svc.send("n1", SessionState(0, "s", True, FROM_OWNER + state))  # resent at link-up
        await _replicated(relay, lambda: b"m1" in _payloads(client), "m1 delivered")
        assert _payloads(client) == [b"m0", b"m2", b"m1"]  # late, not lost
    finally:
        await relay.svc.async_stop()
        await old_owner.svc.async_stop()
        await stop_node(n1)
