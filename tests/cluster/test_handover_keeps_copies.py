"""A hand-over held behind a QoS2 hold while its replicas dropped their copy (chaos seed 100334, batch of main 86b8ba9,
4 reordered for sub1: pub0#160-161 and pub2#106-107 late).

node2 owned sub1 (replica node0) and was the home of the QoS2 publisher pub3 (replica node0, so node1's streams were
held for its packet ids). node1 asked for sub1; node2 released it: the hand-over waited behind pub3's holds, while
the claim (pushed at once) and the OP_DROP of node0's copy (node0's replica stream, not held) went out. node2 was
SIGSTOPped before the holds ended. node1, its claim relayed, refused the CONNECT (no answer), then started sub1 from
its claim at the retry: node0, asked for a copy, had none. The session got node1's forwards buffered for node2
(pub0#162+, pub1#162+, pub2#108+) first; the hand-over (pub0#160-161, pub2#106-107 ...) came 0.3 s later with
node2's return and was merged behind them.

The old owner's replicas now keep their copy until the taker confirms the hand-over (make before break): a stand-in
start resumes from it (test_stand_in_copy.py).
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Message, SubscriptionOptions
from appliance.cluster.ownership import OP_DROP, OP_SNAPSHOT
from appliance.cluster.wire import SessionDone, SessionState, SessionTakeover
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


async def test_the_replicas_keep_their_copy_until_the_taker_confirms_the_hand_over(tmp_path: Path) -> None:
    """na owns s (m1 queued, replica nc) and the QoS2 publisher p (replica nc). nb asks for s while p's id 1 is
    unacknowledged: the hand-over waits behind that hold. nc must keep its copy of s (no OP_DROP) until nb confirms
    the hand-over; then it drops it. Before the fix nc dropped it at once: with na frozen before the hold ended,
    no copy of s was left anywhere but na."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"))
    wiring = wiring_of(na)
    p, s = client_replicated_on("p", "nc"), client_replicated_on("s", "nc")
    r = client_replicated_on("r", "nc")  # another session, its replica operations behind s's on nc's stream
    nb, nc = Peer("nb"), Peer("nc")

    def drops() -> list[str]:
        return [r.client_id for _p, r in nc.replicated if r.op == OP_DROP]

    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        await own_replicated(na, nc, {s: SUBS, p: {}, r: SUBS})
        route_on(na, Message("m1", "t/x", b"m1", 1, False, "pub", 1000.0))
        await until(lambda: [d.message.msg_id for d in na.broker.sessions[s].queue] == ["m1"], "m1 queued for s")
        nc.ack_replicas()

        publish_qos2_on(na, p, 1, Message(f"{p}-1", "q/x", b"x", 2, False, p, 1000.0))  # nb's streams held
        nb.svc.send("na", SessionTakeover(7, s, "nb", False))
        await until(lambda: wiring.claims[s].owner == "nb", "s let go to nb")
        before = len(nc.replicated)
        route_on(na, Message("m2", "t/x", b"m2", 1, False, "pub", 1001.0))  # for r: behind s's release at nc
        await until(lambda: any(op.client_id == r for _p, op in nc.replicated[before:]), "m2 for r at nc")
        assert not [m for m in nb.session_messages if isinstance(m, SessionState)]  # behind the hold
        assert [r.client_id for _p, r in nc.replicated if r.op == OP_SNAPSHOT].count(s) == 1
        assert s not in drops(), "nc dropped its copy of s while the hand-over was held: the only one left is na's"

        nc.ack_replicas()  # the hold ends: the hand-over goes out
        await until(lambda: [m for m in nb.session_messages if isinstance(m, SessionState)], "hand-over at nb")
        assert s not in drops(), "nc dropped its copy of s before nb confirmed the hand-over"
        nb.svc.send("na", SessionDone(7, s))
        await until(lambda: s in drops(), "nc drops its copy of s once nb confirmed")
        assert s not in wiring._handing
    finally:
        for peer in (nb, nc):
            await peer.svc.async_stop()
        await stop_node(na)
