"""A stream write made while a link-up is reported goes out after the resend of what the peer has not acknowledged
(chaos seed 110340, batch of main 1385f9e: pub2#11 twice to sub1 (QoS2), pub2#11 / pub3#10-11 late for sub0).

node2 owned pub2 (replica node1), pub3 (replica node0), sub0 (replica node1) and sub1 (replica node0). pub3#10,
pub2#11 and pub3#11 came just before node2's SIGSTOP: pub3's packet ids (held by node0) held the replica stream to
node1 behind them, so node1 never got pub2's packet id 11 nor sub0's enqueues of the three. At the SIGCONT node2
found both links expired and, on a minority side, held what waited for them. node1's link came back first: its
up report released the holds on node0 (a majority again), which rebuilt sub1's copy (replica node0, an enqueue
unacknowledged) on node1 with a snapshot, sent at once on the new link, ahead of the resend of node1's stream.
node1 took the snapshot's seq for a gap the sender had released, dropped the resend as duplicates and acknowledged
it all. node2 was SIGKILLed 0.9 s later: pub2, resumed on node1 without packet id 11, had its DUP resend of #11
routed as new (sub1, handed #11 by node2, got it twice); sub0, started on node0 from node1's copy, got pub2#11 and
pub3#10-11 after newer ones. Now what the up report writes to the peer's streams goes out with the resend, in
order.

Real node na (broker + SQLite + ClusterWiring) on loopback; nb and nc are bare ClusterServices. nb's return is a
new service with na's replica stream restored where the old one had committed it, as a node restores it from disk
(node1's stayed in memory across the link drop).
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import (
    MIGRATED,
    OP_ENQUEUE_MANY,
    OP_QOS2_ADD,
    OP_SNAPSHOT,
    SessionClaim,
    decode_qos2_add,
    encode_claim,
)
from tests.cluster.wired_node import (
    Peer,
    client_replicated_on,
    link,
    packet_id_cut_off_then_replica_back,
    start_node,
    stop_node,
    until,
    wiring_of,
)

SUBS = {"t/#": SubscriptionOptions(qos=1)}


async def test_a_snapshot_written_during_a_link_up_report_follows_the_resend_of_what_the_peer_lacks(
        tmp_path: Path) -> None:
    """na owns the QoS2 publisher p (replica nb) and the offline subscriber s (replica nc). nb goes down; p's
    QoS2 m1 (packet id 1) waits in na's stream to nb, s's enqueue of it is unacknowledged by nc, which goes down
    too: na is a minority side and holds it. nb returns: na, a majority again, rebuilds s on nb (a snapshot) in
    the up report. nb must get p's packet id, then s's snapshot. Before the fix the snapshot went out first, nb
    dropped the resent packet id as a duplicate and acknowledged it: p resumed there would route m1's DUP resend
    as new."""
    pub, sub = client_replicated_on("p", "nb"), client_replicated_on("s", "nc")
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    nb, nc, back = Peer("nb"), Peer("nc"), Peer("nb")
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        for cid, subs in ((pub, {}), (sub, SUBS)):
            wiring.svc.put("sessions", cid, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, dict(subs))))
            adopt_session(na.broker, SessionRecord(cid, 5, 3600, subscriptions=dict(subs)), [], [])
        await until(lambda: any(r.client_id == pub for _p, r in nb.replicated)
                    and any(r.client_id == sub for _p, r in nc.replicated), "the snapshots of p at nb, s at nc")
        nb.ack_replicas()
        nc.ack_replicas()
        await until(lambda: not any(s.in_transit for s in wiring.svc.replica_senders.values()), "both held")
        wiring._rebalance_pending = True  # placement stays as it is (a rebalance would move p off nb meanwhile)

        await packet_id_cut_off_then_replica_back(
            na, nb, nc, back, pub,
            lambda: any(r.client_id == sub and r.op == OP_ENQUEUE_MANY for _p, r in nc.replicated),
            "s's enqueue of m1 at nc (never acknowledged)")
        await until(lambda: any(r.client_id == sub and r.op == OP_SNAPSHOT for _p, r in back.replicated),
                    "s rebuilt on nb")
        await until(lambda: back.ack_replicas() or wiring.svc.replica_senders["nb"].in_transit == 0,
                    "na's stream to nb acknowledged")
        arrived = [(r.client_id, r.op) for _p, r in back.replicated]
        # p's pending entry is released (OP_STRANDED_DEL) once nb holds s; before the fix: [(s, 1), (p, 10)]
        assert arrived[:2] == [(pub, OP_QOS2_ADD), (sub, OP_SNAPSHOT)], "nb acknowledged p's packet id without it"
        assert decode_qos2_add(back.replicated[0][1].data)[0] == 1
    finally:
        for peer in (nb, nc, back):
            await peer.svc.async_stop()
        await stop_node(na)
