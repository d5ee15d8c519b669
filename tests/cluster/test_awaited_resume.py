"""A session resumed elsewhere while its hand-over to us was awaited (chaos seed 110899, batch of main 1385f9e,
44 reordered for sub0: pub1#96-119 and pub2#63-82 after newer ones).

node1 owned sub0 and was being isolated; sub0 lost node1 and asked node2, whose question reached node1: node1 let
sub0 go to node2, its claim came through, its hand-over never did. node2 routed sub0's messages through node1 (the
awaited old owner): node1 acknowledged pub1#96-101 and pub2#63-66 (passed on to node2, behind the lost hand-over),
then the link went down and pub1#102-119, pub2#67-82 stayed in node2's buffer for node1. node2 refused sub0 (no
answer from node1). sub0 went to node0, which asked node2: node2, claiming sub0 itself, answered "no session" and
node0 resumed sub0 from its replica of node1 (up to pub1#95). At node0's claim node2 dropped what node1 had
acknowledged (node1 passes it on) and kept the buffered ones for node1 (the old claim was its own: nothing to
retarget), so sub0 got pub1#120+ first; the rest came from node1 after the heal (node1 "moved node2 -> node0: 10
buffered forwards follow it"), and via node1 again once node2's link to it was back.

Now a node that answers a resume question for a session whose hand-over it awaits holds for it as for the owner's
(the awaited old owner stands for the owner): what the old owner acknowledged for it and what is buffered for it
follow the resume's claim, in order, before anything newer. A real node "na" (node2), the old owner "nb" (node1) as
a bare ClusterService; the asker "nc" (node0) is only named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.broker.model import Message, SubscriptionOptions
from appliance.cluster.ownership import FRESH, FROM_REPLICA, MIGRATED, SessionClaim, encode_claim
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.wire import SessionTakeover
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub", 1000.0)


@pytest.mark.parametrize("nb_back", [False, True])
async def test_an_awaited_old_owners_messages_follow_a_resume_elsewhere(tmp_path: Path, nb_back: bool) -> None:
    """nb lets s go to na (its claim arrives, the hand-over does not) and acknowledges m1 routed to it; its link drops
    with m2 buffered for it. nc asks na for s ("no session") and resumes it: m1, m2, then the newer m3 must go to nc,
    also if nb links up again between our answer and nc's claim (m2 is held, not resent to nb). Before the fix nc
    got only m3 (m1 left to nb, m2 kept in nb's stream: both late, after newer ones)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wa = wiring_of(na)
    nb, nb_again = Peer("nb"), Peer("nb")
    nb.svc.spaces["sessions"] = ReplicatedSpace("sessions", "nb")
    try:
        await nb.svc.async_start()
        await link(wa.svc, nb.svc)
        nb.svc.put("sessions", "s", encode_claim(SessionClaim("nb", 1000.0, FRESH, True, dict(SUBS))))
        await until(lambda: "s" in wa.claims, "nb's claim of s at na")
        nb.svc.put("sessions", "s", encode_claim(SessionClaim("na", 1001.0, MIGRATED, True, dict(SUBS), {"nb": 5})))
        await until(lambda: wa._awaited("s") == "nb", "na's claim of s at na, the hand-over awaited")

        wa.route_remote(_message("m1"), [])  # for s: to nb, acknowledged there (passed on behind its hand-over)
        await until(lambda: "m1" in nb.received and wa.svc.senders["nb"].in_transit == 0, "nb's ack of m1")
        await nb.svc.async_stop()
        await until(lambda: not wa.svc.links.is_up("nb"), "nb down at na")
        wa.route_remote(_message("m2"), [])  # for s: buffered for nb
        assert [f.message.msg_id for f in wa.svc.senders["nb"].resend()] == ["m2"]

        wa._on_session_message("nc", SessionTakeover(7, "s", "nc", False))  # answered "no session here"
        if nb_back:
            await nb_again.svc.async_start()
            await link(wa.svc, nb_again.svc)
        resumed = SessionClaim("nc", 2000.0, FROM_REPLICA, True, dict(SUBS), {"nb": 3})
        wa.svc.put("sessions", "s", encode_claim(resumed))  # nc's claim arrives
        await until(lambda: wa.claims["s"].owner == "nc", "nc's claim of s at na")
        wa.route_remote(_message("m3"), [])
        assert [f.message.msg_id for f in wa.svc.senders["nc"].resend()] == ["m1", "m2", "m3"]
        assert wa.svc.senders["nb"].resend() == [] and nb_again.received == []
    finally:
        for peer in (nb, nb_again):
            await peer.svc.async_stop()
        await stop_node(na)
