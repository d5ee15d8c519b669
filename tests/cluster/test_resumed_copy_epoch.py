"""A resumed session's replica copy overwritten by the old owner's late record (chaos seed 110009, batch of main
1385f9e, 46 acknowledged messages lost for sub1: pub0#99-124, pub3#73-92).

node0 owned sub1 (claim E0) with node2 as its replica and was isolated; pub0 and pub3 on node1 published for sub1,
their forwards buffered for node0 and acknowledged once node0 was down (stranded on their publishers' replica,
node2). node0, a minority side, fenced sub1: the record write (claim epoch E0) waited in its stream to node2. sub1
reconnected to node1, which resumed it from a copy (28 queued), retargeted its 82 buffered forwards into it
(releasing the stranded entries) and sent node2 a snapshot, stamped with the epoch of the claim it superseded: E0,
its own claim being written only at the CONNECT that follows. node0's isolation ended: its resent E0 record reached
node2 after node1's snapshot and, not older than the copy, replaced it with node0's (the queue reset); node1's
enqueues were ignored (not the copy's owner) and its record under its new claim E1 made a new copy with an empty
queue. node1 was SIGKILLed 0.6 s later; sub1 resumed on node0 from that copy: 2 queued, the 46 gone (claim bases
{node0: 337, node1: 382}, node1's mark 0: a copy made by a record, not a snapshot).

Real nodes (broker + SQLite + ClusterWiring) and a bare ClusterService as the old owner, on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import Delivery, Message, SessionRecord, SubscriptionOptions
from appliance.cluster.ownership import FRESH, OP_SESSION, OP_SNAPSHOT, SessionClaim, encode_claim, encode_snapshot
from appliance.protocol.reason_codes import ReasonCode
from tests.cluster.test_stand_in_connect import connect_persistent
from tests.cluster.wired_node import Peer, link, route_on, start_node, stop_node, until, wiring_of

SUBS = {"t/#": SubscriptionOptions(qos=1)}
E0 = 1000.0  # the old owner's claim


def _message(msg_id: str) -> Message:
    return Message(msg_id, "t/x", msg_id.encode(), 1, False, "pub", E0)


async def test_the_old_owners_late_record_does_not_replace_the_copy_of_the_session_resumed_from_it(
        tmp_path: Path) -> None:
    """na owns s under E0 (m1 queued, on nc's copy) and is cut off. nb resumes s from nc's copy, takes m2 and
    replicates both to nc. na comes back and its record of s under E0, sent while it was cut off, reaches nc; then
    the client's CONNECT on nb writes nb's claim. nc's copy (what a resume gets if nb dies now) must hold m1 and m2.
    Before the fix nb's snapshot carried E0 too: na's record replaced it, and nb's record under its claim left a
    copy with an empty queue."""
    nb = await start_node(tmp_path / "nb", "nb", ("na", "nc"))
    nc = await start_node(tmp_path / "nc", "nc", ("na", "nb"))
    cut_off, back = Peer("na"), Peer("na")
    started: list[Peer] = []
    try:
        await link(wiring_of(nb).svc, wiring_of(nc).svc)
        await cut_off.svc.async_start()
        started.append(cut_off)
        await link(wiring_of(nc).svc, cut_off.svc)  # na reaches nc only
        wiring_of(nc).svc.put("sessions", "s", encode_claim(SessionClaim("na", E0, FRESH, True, dict(SUBS))))
        await until(lambda: "s" in wiring_of(nb).claims, "na's claim of s at nb")
        record = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS))
        cut_off.svc.replicate("nc", "s", OP_SNAPSHOT,
                              encode_snapshot(E0, record, [Delivery(1, _message("m1"), 1, False)], [], 1))
        await until(lambda: "s" in wiring_of(nc).copies, "na's copy of s at nc")

        await cut_off.svc.async_stop()  # na isolated
        started.remove(cut_off)
        await until(lambda: not wiring_of(nc).svc.links.is_up("na"), "na down at nc")
        fetch = wiring_of(nb).prepare_connect("s", False)
        assert fetch is not None
        assert await fetch == ReasonCode.SUCCESS  # resumed from nc's copy
        route_on(nb, _message("m2"))  # a forward retargeted into s at the resume, in the chaos run

        def copy_at_nc() -> list[str]:
            copy = wiring_of(nc).copies.get("s")
            return [] if copy is None else [d.message.msg_id for d in copy.deliveries()]

        await until(lambda: wiring_of(nc).copies["s"].owner == "nb" and copy_at_nc() == ["m1", "m2"],
                    "nb's copy of s at nc")

        # na's isolation ends: the record it wrote when it fenced s (its claim's epoch) is resent to nc
        back.svc.restore_replication("nc", next_seq=100)  # stream seqs keep growing across its links
        await back.svc.async_start()
        started.append(back)
        await link(wiring_of(nc).svc, back.svc)
        fenced = SessionRecord("s", 5, 3600, subscriptions=dict(SUBS), disconnected_at=E0 + 1)
        back.svc.replicate("nc", "s", OP_SESSION, encode_snapshot(E0, fenced, [], []))
        await until(lambda: not back.svc.replica_senders["nc"].resend(), "nc's ack of na's record")

        await connect_persistent(nb, back)  # nb's own claim of s, its record replicated under it
        await until(lambda: wiring_of(nc).copies["s"].epoch > E0 + 1, "nb's claim's record at nc")
        assert wiring_of(nc).copies["s"].owner == "nb"
        assert copy_at_nc() == ["m1", "m2"], "the copy a resume would take lost the session's queue"
    finally:
        for peer in started:
            await peer.svc.async_stop()
        await stop_node(nb)
        await stop_node(nc)
