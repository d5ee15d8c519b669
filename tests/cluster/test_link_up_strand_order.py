"""A forward stranded while a replica's link-up is reported reaches that replica after the resend of the packet id it
lacks (chaos seed 110766, batch of main 1385f9e: pub3#16-17 twice to sub0 (QoS2), #16-19 twice to sub2 (QoS1)).

node1 owned the QoS2 publisher pub3 (replica node0). SIGSTOPped for 2.7 s, it read pub3#16-19 at the SIGCONT and
wrote their packet ids to node0 on a link node0 had already dropped; both links expired (node2's first), a minority
side: the waits on node2 were held. node0's link came back first (node2's 8 ms later): its up report, a majority
again, released node2's waits, which stranded the forwards in flight to node2 (pub3's copies for sub2) on pub3's
replica node0 (OP_STRANDED_ADD), sent at once on the new link, ahead of the resend of the unacknowledged packet
ids. node0 took the jump for a gap the sender had released, dropped the resent ids as duplicates and acknowledged
them. node1 was SIGKILLed 0.4 s later: pub3 resumed on node0 without ids 16-19 ("2 stranded passed on": #14/#15's
pending entries), so its DUP resends were routed as new. The race of seed 110340; its fix (c42e021: what the up
report writes to the peer's streams goes out with the resend, in order) closes this path too.

Real node na (broker + SQLite + ClusterWiring) on loopback; nb and nc are bare ClusterServices. nb's return is a
new service with na's replica stream restored where the old one had committed it.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.handover import adopt_session
from appliance.broker.model import SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import (
    MIGRATED,
    OP_QOS2_ADD,
    OP_STRANDED_ADD,
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

SUBS = {"t/#": SubscriptionOptions(qos=2)}


async def test_a_forward_stranded_during_a_replica_link_up_report_follows_the_resend_of_the_packet_id(
        tmp_path: Path) -> None:
    """na owns the QoS2 publisher p (replica nb); s is owned by nc. nb goes down; p's m1 (packet id 1) waits in
    na's stream to nb while its forward to nc stays unacknowledged; nc goes down too: na, a minority side, holds
    the waits on nc. nb returns: na, a majority again, strands m1's forward to nc on p's replica nb in the up
    report. nb must get p's packet id, then the stranded forward. Before the fix the stranded forward went out
    first, nb dropped the resent packet id as a duplicate and acknowledged it: p resumed there would route m1's DUP
    resend as new."""
    pub = client_replicated_on("p", "nb")
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    nb, nc, back = Peer("nb"), Peer("nc"), Peer("nb")
    nc.svc.cb.on_forward = lambda _peer, fwd: nc.received.append(fwd.message.msg_id)  # never acknowledged
    try:
        for peer in (nb, nc):
            await peer.svc.async_start()
            await link(wiring.svc, peer.svc)
        wiring.svc.put("sessions", "s", encode_claim(SessionClaim("nc", 1000.0, MIGRATED, True, dict(SUBS))))
        wiring.svc.put("sessions", pub, encode_claim(SessionClaim("na", 1000.0, MIGRATED, True, {})))
        adopt_session(na.broker, SessionRecord(pub, 5, 3600), [], [])
        await until(lambda: "s" in wiring.claims and any(r.client_id == pub for _p, r in nb.replicated),
                    "s's claim at na, p's snapshot at nb")
        nb.ack_replicas()
        await until(lambda: not any(s.in_transit for s in wiring.svc.replica_senders.values()), "p held by nb")
        wiring._rebalance_pending = True  # placement stays as it is (a rebalance would move p off nb meanwhile)

        await packet_id_cut_off_then_replica_back(na, nb, nc, back, pub, lambda: "m1" in nc.received,
                                                  "m1's forward at nc (never acknowledged)")
        await until(lambda: any(r.client_id == pub and r.op == OP_STRANDED_ADD for _p, r in back.replicated),
                    "m1's forward to nc stranded on nb")
        await until(lambda: back.ack_replicas() or wiring.svc.replica_senders["nb"].in_transit == 0,
                    "na's stream to nb acknowledged")
        arrived = [(r.client_id, r.op) for _p, r in back.replicated]
        # then the pending entry's release (OP_STRANDED_DEL, m1 held by nb as stranded); before the fix:
        # [(p, OP_STRANDED_ADD), (p, OP_STRANDED_DEL)], the packet id dropped as a duplicate
        assert arrived[:2] == [(pub, OP_QOS2_ADD), (pub, OP_STRANDED_ADD)], "nb acknowledged p's packet id without it"
        pid, _mark, entry = decode_qos2_add(back.replicated[0][1].data)
        assert pid == 1 and entry
        assert [f.message.msg_id for f in wiring.svc.senders["nc"].resend()] == ["m1"]  # still nc's, stranded
    finally:
        for peer in (nb, nc, back):
            await peer.svc.async_stop()
        await stop_node(na)
