"""A session started here from its claim while its hand-over is stuck on a dead old owner, with our replica copy of
it (chaos seed 90187, batch of b9c3310, 15 acknowledged messages lost for sub2): node0 owned the offline sub2 with
node1 as its replica (pub0#207-211, pub1#154-155, pub2#110-111 and pub3#149-154 queued and replicated, then
acknowledged), let it go to node1's takeover question and was SIGKILLed with the hand-over still held behind QoS2
holds (and the OP_DROP of node1's copy unsent). sub2's retried CONNECT on node1 started the session from its claim,
empty, although node1's own copy held those 15 messages: they came only with the late hand-over after node0's
restart, merged into a session the subscriber had long left (still in node1's queue at the end of the run).

Real node (broker + SQLite + ClusterWiring) and bare ClusterService peers, on loopback; the client on an
in-memory link through the broker's own CONNECT.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.model import Delivery, SessionRecord
from appliance.cluster.ownership import (
    FRESH,
    MIGRATED,
    OP_SNAPSHOT,
    SessionClaim,
    apply_op,
    encode_claim,
    encode_copy,
    encode_handover,
    encode_snapshot,
)
from appliance.cluster.wire import SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.test_stand_in_connect import (
    FROM_OWNER,
    SUBS,
    _message,
    _payloads,
    _replicated,
    connect_persistent,
)
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

FROM_COPY = bytes([2])


async def test_a_stand_in_start_resumes_from_our_copy_of_the_old_owners_session(tmp_path: Path) -> None:
    """n1 is the replica of n0's offline session s (m1 queued there, m1 in n1's copy); n0 lets s go to n1 (claim
    relayed by n2) and dies before its hand-over leaves. m2, published on n1 meanwhile, is buffered for n0. The
    client's CONNECT on n1 starts s from its claim: m1 from n1's copy first, then m2; n0's hand-over, resent when it
    returns, adds nothing twice. Before the fix the session started empty: the client got m2 only, m1 came with the
    late hand-over (after the subscriber had gone, in the chaos run)."""
    n1 = await start_node(tmp_path / "n1", "n1", ("n0", "n2"))
    old_owner, relay = Peer("n0"), Peer("n2")
    wiring = wiring_of(n1)
    returned = Peer("n0")
    try:
        await relay.svc.async_start()
        await link(wiring.svc, relay.svc)  # n1 reaches half of the members: not a minority side
        await old_owner.svc.async_start()
        await link(wiring.svc, old_owner.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n0", 1000.0, FRESH, True, dict(SUBS))))
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        queue = [Delivery(1, _message("m1", 1), 1, False)]
        old_owner.svc.replicate("n1", "s", OP_SNAPSHOT, encode_snapshot(1000.0, record, queue, []))
        await until(lambda: "s" in wiring.copies and len(wiring.copies["s"].queue) == 1, "n1's copy of s")
        await old_owner.svc.async_stop()  # SIGKILL: neither its hand-over nor the OP_DROP of our copy leaves
        await until(lambda: not wiring.svc.links.is_up("n0"), "n0 down")

        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n0": 2})))
        assert wiring.claims["s"].owner == "n1" and "s" not in n1.broker.sessions
        wiring.route_remote(_message("m2", 2), [])  # published meanwhile: buffered for n0 (its hand-over awaited)

        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None and await fetch == ReasonCode.SUCCESS
        client = await connect_persistent(n1, relay)
        await _replicated(relay, lambda: b"m2" in _payloads(client), "m2 delivered")
        assert _payloads(client) == [b"m1", b"m2"]  # the copy's queue first, not only with the late hand-over
        assert "s" not in wiring.copies  # resumed from it: the copy is gone

        await returned.svc.async_start()
        await link(wiring.svc, returned.svc)
        state = encode_handover(2000.0, record, queue, [], ["m1"])
        returned.svc.send("n1", SessionState(0, "s", True, FROM_OWNER + state))  # resent at its return
        await until(lambda: returned.done(), "SessionDone for the late hand-over")
        await _replicated(relay, lambda: not n1.broker.sessions["s"].queue, "queue drained")
        assert _payloads(client) == [b"m1", b"m2"]  # nothing twice
    finally:
        await relay.svc.async_stop()
        await returned.svc.async_stop()
        await stop_node(n1)


async def test_a_stand_in_start_resumes_from_a_peers_copy_of_the_old_owners_session(tmp_path: Path) -> None:
    """The same with n0's replica of s on n2, not on the taker n1: n1 asks its peers, n2 answers with its copy
    (m1), and the session starts from it: m1 before m2. Before, it started empty (m2 only)."""
    n1 = await start_node(tmp_path / "n1", "n1", ("n0", "n2"))
    relay = Peer("n2")
    wiring = wiring_of(n1)
    try:
        await relay.svc.async_start()
        await link(wiring.svc, relay.svc)
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        queue = [Delivery(1, _message("m1", 1), 1, False)]
        copy = apply_op(None, "n0", OP_SNAPSHOT, encode_snapshot(1000.0, record, queue, []))
        assert copy is not None
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n0", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n0": 2})))
        wiring.route_remote(_message("m2", 2), [])  # buffered for n0 (its hand-over awaited, n0 unreachable)

        fetch = wiring.prepare_connect("s", False)
        assert fetch is not None
        answered = asyncio.ensure_future(fetch)
        await until(lambda: answered.done() or any(isinstance(m, SessionTakeover) for m in relay.session_messages),
                    "n1 asks n2 (or starts s)")
        for ask in [m for m in relay.session_messages if isinstance(m, SessionTakeover)]:
            relay.svc.send("n1", SessionState(ask.request_id, "s", True, FROM_COPY + encode_copy(copy)))
        assert await answered == ReasonCode.SUCCESS
        client = await connect_persistent(n1, relay)
        await _replicated(relay, lambda: b"m2" in _payloads(client), "m2 delivered")
        assert _payloads(client) == [b"m1", b"m2"]
    finally:
        await relay.svc.async_stop()
        await stop_node(n1)
