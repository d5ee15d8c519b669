"""A replica copy knows every message its session had, not only what was queued since the copy began (chaos seed
30033, a QoS2 duplicate): node0 took sub1 over by a hand-over (the ids sub1 had had came with it) and placed a new
replica, which learnt only the 24 queued ids from its snapshot. node0 was SIGKILLed; sub1 resumed from that copy
on node1 and received, as new, pub2's message #131 that it had completed 6.7 s earlier: a stale pending entry of
pub2's resumed copy passed it on again, and nothing remembered its id.

Real nodes (broker + SQLite + ClusterWiring) on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.cluster.wire import Forward
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.wired_node import link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=2)}


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", b"x", 2, False, "pub2", 1000.0)


async def test_a_session_resumed_from_a_replica_placed_after_a_hand_over_drops_what_it_had_before(
        tmp_path: Path) -> None:
    """na adopts s by a hand-over: m1 was delivered and completed on the old owner (only its id comes along), m2 is
    still queued. na places s's replica on nb (a snapshot) and dies. s resumes on nb from that copy; a late copy of
    m1 then reaches s (a stale pending message passed on, a retargeted forward): it is dropped, not delivered as new.
    Before the fix the snapshot carried only the queued ids, so m1 was queued again: a QoS2 duplicate."""
    na = await start_node(tmp_path / "na", "na", ("nb",))
    nb = await start_node(tmp_path / "nb", "nb", ("na",))
    na_running = True
    try:
        await link(wiring_of(na).svc, wiring_of(nb).svc)
        claim = SessionClaim("na", 1000.0, MIGRATED, True, dict(SUBS))
        wiring_of(na).svc.put("sessions", "s", encode_claim(claim))
        await until(lambda: "s" in wiring_of(nb).claims, "na's claim of s at nb")
        record = SessionRecord("s", 3, 3600, subscriptions=dict(SUBS))
        handed = encode_handover(900.0, record, [Delivery(2, _message("m2"), 2, False)], [], ["m1", "m2"])
        wiring_of(na)._on_handover("nc", "s", handed, False, True)  # the old owner "nc" hands s over
        await until(lambda: "s" in wiring_of(nb).copies, "nb holding na's copy of s")

        await stop_node(na)  # gone without handing s over: nb resumes it from its copy
        na_running = False
        await until(lambda: not wiring_of(nb).svc.links.is_up("na"), "na down at nb")
        fetch = wiring_of(nb).prepare_connect("s", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS
        session = nb.broker.sessions["s"]
        assert [d.message.msg_id for d in session.queue] == ["m2"]

        wiring_of(nb)._on_forward("nc", Forward(7, _message("m1"), ("s",)))  # m1 again, from a stale pending entry
        wiring_of(nb)._on_forward("nc", Forward(8, _message("m3"), ("s",)))  # a new message is delivered
        assert [d.message.msg_id for d in session.queue] == ["m2", "m3"]
    finally:
        await stop_node(nb)
        if na_running:
            await stop_node(na)
