"""A hand-over superseded by a third node's resume reached the new owner only through its first taker, behind newer
forwards (chaos seed 100302, batch of main 86b8ba9, 7 reordered: pub0#37-40, pub2#29-31 late for sub2).

node0 let sub2 go to node2 (pub0#37-40 and pub2#29-31 queued, their replica writes to node1 cut) right as node0 was
isolated: the hand-over was lost with the link (kept in ho/sub2, unconfirmed), node2 refused the CONNECT (36.405). sub2
connected to node1, which resumed it from its replica copy of node0 (36.754, "1 queued": the copy lacked those 7).
At the heal node0 learnt node1's claim (37.843, "moved node2 -> node1": pub2#32 retargeted) and routed pub0#41+ to
node1 directly, but the queue of its hand-over went only to node2 with the resend at that link-up, and node2 passed
it on (38.523, "late hand-over by node0 passed on to its owner node1 (10 of 10 queued)"): behind pub2#32, pub0#41-51.

The old owner now passes on what the new owner's lineage lacks of its superseded hand-over itself, when it learns the
claim, ahead of the forwards it retargets and of anything newer.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Message, SubscriptionOptions
from appliance.cluster.ownership import FROM_REPLICA, SessionClaim, encode_claim
from appliance.cluster.wire import SessionState, SessionTakeover
from tests.cluster.wired_node import (
    Peer,
    client_replicated_on,
    link,
    own_replicated,
    route_on,
    start_node,
    stop_node,
    until,
    wiring_of,
)

SUBS = {"t/#": SubscriptionOptions(qos=1)}


async def test_an_old_owner_passes_its_superseded_hand_over_on_to_the_new_owner_ahead_of_newer_forwards(
        tmp_path: Path) -> None:
    """na owns s (m1 queued, its replica nc's copy lacks it) and lets it go to nb, which never confirms. nc resumes s
    from its copy (claim newer than nb's, na's base at m1's seq). Then m2 is published on na. nc must get m1 before
    m2. Before the fix na sent m2 to nc at once and m1 only went to nb (its resent hand-over, passed on late)."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    s = client_replicated_on("s", "nc")
    nb, nc = Peer("nb"), Peer("nc")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        await own_replicated(na, nc, {s: SUBS})
        route_on(na, Message("m1", "t/x", b"m1", 1, False, "pub", 1000.0))
        await until(lambda: [d.message.msg_id for d in na.broker.sessions[s].queue] == ["m1"], "m1 queued for s")
        [m1_seq] = [d.seq for d in na.broker.sessions[s].queue]

        nb.svc.send("na", SessionTakeover(7, s, "nb", False))
        await until(lambda: wiring.claims[s].owner == "nb" and s in wiring._handing, "s let go to nb")
        await until(lambda: [m for m in nb.session_messages if isinstance(m, SessionState)], "the hand-over at nb")
        # nb never confirms it (its link to na drops in the chaos run); nc resumes s from its copy, which lacks m1
        resumed = SessionClaim("nc", wiring.claims[s].epoch + 1.0, FROM_REPLICA, True, dict(SUBS), {"na": m1_seq})
        wiring.svc.put("sessions", s, encode_claim(resumed))  # as nc's digest brings it
        await until(lambda: wiring.claims[s].owner == "nc", "nc's claim at na")

        route_on(na, Message("m2", "t/x", b"m2", 1, False, "pub", 1001.0))
        await until(lambda: "m2" in nc.received, "m2 at nc")
        assert nc.received[:2] == ["m1", "m2"], f"nc got {nc.received}: m1 (in the superseded hand-over) not ahead"
    finally:
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)
