"""A hand-over resent at link-up behind a QoS2 hold was overtaken by the forwards buffered after it (chaos seed 80026,
batch of main 336dcf4, 37 reordered: pub0#48-55, pub1#48-55, pub2#48-57, pub3#47-57 late for sub2).

node0 owned the offline sub2 (pub0#48-55 and pub1#48-55 forwarded by node1 and pub2/pub3's from node0's own clients
queued) and let it go to node1, whose takeover question arrived as node0 and node1 were partitioned: the hand-over
was lost with the link, node1's claim reached node1 through node2. node0 then forwarded pub2/pub3's newer messages
for sub2 to node1 (buffered, link down), node1 buffered pub0/pub1's for node0 (the hand-over awaited). At the heal
(03:51:42.67) node0 resent the hand-over through send_behind_holds: pub2/pub3's QoS2 holds on node1's streams kept it
back, while the link-up resent the buffered forwards at once. node1 got pub2/pub3#58+ for sub2 before any hand-over,
took them for forwards of a sender that had none (_on_forward's orphans), started sub2 from its claim (42.804: "no
hand-over from node0 yet") with its own buffered pub0/pub1#56+ retargeted into it, and merged the hand-over behind
them when it came (42.948: "late hand-over by node0 merged (41 of 41 queued)"); sub2 got them after newer ones.

The resent hand-over now holds the forwards buffered for its taker too: at link-up it goes out first, as it did
before hand-overs waited behind holds (chaos seed 30270).
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Message, SubscriptionOptions
from appliance.cluster.wire import Forward, SessionState, SessionTakeover
from tests.cluster.wired_node import (
    Peer,
    client_replicated_on,
    link,
    own_replicated,
    publish_qos2_on,
    route_on,
    start_node,
    stop_node,
    until,
    wiring_of,
)

SUBS = {"t/#": SubscriptionOptions(qos=1)}






async def test_a_hand_over_resent_behind_a_hold_at_link_up_goes_ahead_of_the_forwards_buffered_after_it(
        tmp_path: Path) -> None:
    """na owns s (m1 queued) and the QoS2 publisher p (replica nc). nb asks for s while p's id 1 is unacknowledged:
    the hand-over waits behind that hold, nb is gone before it leaves (lost), and m2, published for s after, is
    buffered for nb (the claim's owner). At nb's return p's id 2 is unacknowledged: the resent hand-over waits
    again. nb must get it before m2 (m1 ahead of m2 in s). Before the fix the link-up resent m2 at once, ahead of
    the hand-over."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    p, s = client_replicated_on("p", "nc"), client_replicated_on("s", "nc")
    nb, nc, nb_again = Peer("nb"), Peer("nc"), Peer("nb")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        await own_replicated(na, nc, {s: SUBS, p: {}})
        route_on(na, Message("m1", "t/x", b"m1", 1, False, "pub", 1000.0))
        await until(lambda: [d.message.msg_id for d in na.broker.sessions[s].queue] == ["m1"], "m1 queued for s")

        # nc does not acknowledge it yet: nb's streams are held
        publish_qos2_on(na, p, 1, Message(f"{p}-1", "q/x", b"x", 2, False, p, 1000.0))
        nb.svc.send("na", SessionTakeover(7, s, "nb", False))
        await until(lambda: wiring.claims[s].owner == "nb", "s let go to nb")
        assert not [m for m in nb.session_messages if isinstance(m, SessionState)]  # behind the hold
        await nb.svc.async_stop()
        await until(lambda: not wiring.svc.links.is_up("nb"), "nb down at na")
        route_on(na, Message("m2", "t/x", b"m2", 1, False, "pub", 1001.0))  # for s at nb: buffered
        nc.ack_replicas()
        await until(lambda: not wiring._unconfirmed, "p's id 1 acknowledged: the hand-over sent on no link")
        assert s in wiring._handing  # unconfirmed: resent when nb links up

        publish_qos2_on(na, p, 2, Message(f"{p}-2", "q/x", b"x", 2, False, p, 1000.0))  # held again when nb returns
        await nb_again.svc.async_start()
        await link(wiring.svc, nb_again.svc)  # na resent the hand-over and its forward buffer (one FIFO link)
        nc.ack_replicas()
        await until(lambda: "m2" in nb_again.received and nb_again.session_messages, "m2 and the hand-over at nb")
        order = ["handover" if isinstance(m, SessionState) else m.message.msg_id for m in nb_again.arrivals
                 if (isinstance(m, SessionState) and m.client_id == s) or isinstance(m, Forward)]
        assert order[:2] == ["handover", "m2"], f"nb got {order}: m2 overtook the resent hand-over (m1 in it)"
    finally:
        for peer in (nb, nc, nb_again):
            await peer.svc.async_stop()
        await stop_node(na)
