"""The per-session memory of message ids (dedupe of copies) holds only what the session took. A forwarded copy that
matched no subscription of the session here (unsubscribed meanwhile, the sender's view of it stale) was recorded
all the same, before anything was delivered: a later, legitimate copy of that message for the session (the old
owner's queue in a late hand-over, a replica's pending message, a retargeted forward) was then dropped as a
duplicate, silently. The memory also travels with the session (hand-overs, replica snapshots).

Real node (broker + SQLite + ClusterWiring), the peers' messages fed in directly.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, MIGRATED, SessionClaim, encode_claim, encode_handover
from appliance.cluster.wire import Forward
from tests.cluster.wired_node import start_node, stop_node, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _message(msg_id: str, n: int) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub", 1000.0 + n)


async def test_a_copy_that_matched_no_subscription_does_not_hide_a_later_one(tmp_path: Path) -> None:
    """n1 holds s's claim before n0's hand-over and starts s from it (stand-in). The client unsubscribes t/#; n2's
    forward of m1 (its view of s stale) matches nothing here. The client subscribes again; n0's late hand-over
    holds m1 (queued there while s was subscribed) and m2, which n2's forward already brought: m1 joins the queue,
    m2 does not come twice. Before the fix m1's id was recorded by the copy that matched nothing: m1 was dropped."""
    n1 = await start_node(tmp_path / "n1", "n1", ("n0", "n2"))
    wiring = wiring_of(n1)
    try:
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n0", 1000.0, FRESH, True, dict(SUBS))))
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("n1", 2000.0, MIGRATED, True, dict(SUBS),
                                                                  {"n0": 3})))
        wiring._stand_in("s", "n0")  # the client's CONNECT with n0 unreachable (_async_stand_in)
        session = n1.broker.sessions["s"]
        router = n1.broker.router
        wiring._on_forward("n2", Forward(1, _message("m2", 2), ("s",)))  # subscribed: queued
        router.unsubscribe(session, "t/#")
        wiring._on_forward("n2", Forward(2, _message("m1", 1), ("s",)))  # unsubscribed: nothing delivered
        assert [d.message.msg_id for d in session.queue] == ["m2"]
        router.subscribe(session, "t/#", SUBS["t/#"])

        record = SessionRecord("s", 3, 3600, subscriptions=dict(SUBS))
        queue = [Delivery(1, _message("m1", 1), 1, False), Delivery(2, _message("m2", 2), 1, False)]
        wiring._on_handover("n0", "s", encode_handover(2000.0, record, queue, [], ["m1", "m2"]), False, False)
        assert [d.message.msg_id for d in session.queue] == ["m2", "m1"]  # m1 late, not lost; m2 once
    finally:
        await stop_node(n1)
