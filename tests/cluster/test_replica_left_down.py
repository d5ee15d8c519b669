"""A replica left while it was down kept no copy until the new one held its snapshot (chaos seed 100459, batch of
main 86b8ba9: pub2's session lost, 10 QoS2 duplicates for sub0 and sub1).

node0 owned the QoS2 publisher pub2; its copy was on node2 (placement's second choice: node1 had been cut off). node0
was SIGSTOPped with pub2's #97-101 routed but not PUBREC'd; after SIGCONT it declared node1 and node2 down on the
minority side (their acks held). node1's link came back first (20.845, node2's 21 ms later): the held policy for
node2 ran (_release_held -> _release_for_down -> _rebuild_for), re-placed pub2 on node1 and, node2 not being live at
that instant, queued an OP_DROP for node2 at once instead of keeping it until node1 held the snapshot. node2 dropped
its copy at its link-up; node0 was SIGKILLed 0.8 s later; node1, asked by pub2 at 23.234, found "no copy here or at
node2: starting it fresh": pub2's DUP resends of #97-101 were routed as new.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.broker.model import Message, SubscriptionOptions
from appliance.cluster.ownership import OP_DROP
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


async def test_a_replica_left_while_down_keeps_its_copy_until_the_new_one_holds_the_snapshot(tmp_path: Path) -> None:
    """na owns p and s (first choice nb, copies on nc: nb not up yet), p's id 1 and s's m1 unacknowledged at nc.
    nc drops out (na alone: a minority, its acks held); nb comes back: p and s move to nb. nc, back before nb holds
    the snapshots, must not be told to drop its copy (it is the only one besides na's disk); once nb holds them it
    is."""
    na = await start_node(tmp_path / "na", "na", ("nb", "nc"), failure_timeout=1.0)
    wiring = wiring_of(na)
    p, s = client_replicated_on("p", "nb"), client_replicated_on("s", "nb")
    nb, nc, nc_back = Peer("nb"), Peer("nc"), Peer("nc")

    def dropped_at(peer: Peer) -> set[str]:
        return {r.client_id for _p, r in peer.replicated if r.op == OP_DROP}

    try:
        await nc.svc.async_start()
        await link(wiring.svc, nc.svc)
        await own_replicated(na, nc, {p: {}, s: SUBS})
        assert wiring.assigned[p] == ["nc"] and wiring.assigned[s] == ["nc"]
        publish_qos2_on(na, p, 1, Message(f"{p}-1", "q/x", b"x", 2, False, p, 1000.0))
        route_on(na, Message("m1", "t/x", b"m1", 1, False, "pub", 1000.0))
        await until(lambda: len(nc.replicated) >= 4, "p's id and s's m1 at nc")
        await nc.svc.async_stop()
        await until(lambda: not wiring.svc.links.is_up("nc"), "nc down")
        await asyncio.sleep(0.3)

        await nb.svc.async_start()
        await link(wiring.svc, nb.svc)  # the held policy for nc runs: p and s re-placed on nb
        await until(lambda: {p, s} <= {r.client_id for _p, r in nb.replicated}, "snapshots at nb")
        await nc_back.svc.async_start()
        await link(wiring.svc, nc_back.svc)
        await asyncio.sleep(0.5)  # nc's stream resent
        assert p not in dropped_at(nc_back), "nc dropped p's copy before nb held its snapshot: none was left"
        assert s not in dropped_at(nc_back), "nc dropped s's copy before nb held its snapshot: none was left"

        nb.ack_replicas()
        await until(lambda: {p, s} <= dropped_at(nc_back), "nc drops its copies once nb holds the snapshots")
    finally:
        for peer in (nb, nc_back):
            await peer.svc.async_stop()
        await stop_node(na)
