"""A replica copy survives its node's restart whole: the owner's ingress mark and the pending / stranded messages of a
publisher's session are on the replica's disk, not only in its memory. Before, the durable header of a copy was
written without them (and not at all on OP_STRANDED_ADD / OP_STRANDED_DEL): a replica restarted in the window
of a publisher's pending QoS2 message resumed the session without it (not passed on) and with mark 0.

Real node (broker + SQLite + ClusterWiring) as the replica, a real ClusterService as the owner, on loopback.
"""

from __future__ import annotations

from pathlib import Path

from appliance.broker.model import SessionRecord
from appliance.cluster.ownership import (
    OP_QOS2_ADD,
    OP_SNAPSHOT,
    OP_STRANDED_ADD,
    OP_STRANDED_DEL,
    encode_mark_op,
    encode_snapshot,
    encode_texts,
)
from tests.cluster.wired_node import Peer, link, start_node, stop_node, until, wiring_of


async def test_a_copys_mark_and_pending_messages_survive_the_replicas_restart(tmp_path: Path) -> None:
    """nb owns the publisher pub, replicated on na: a snapshot with one stranded message (k1, mark 3), then a pending
    QoS2 message (packet id 5, mark 4), a stranded one (k3, mark 5), and k1's release. na restarts: its copy of pub
    holds mark 5, packet id 5 and exactly the pending QoS2 message and k3, as before the restart."""
    data = tmp_path / "na"
    na = await start_node(data, "na", ("nb",))
    owner = Peer("nb")
    acked: list[int] = []
    ops = [(OP_SNAPSHOT, encode_snapshot(1000.0, SessionRecord("pub", 1, 3600), [], [], 3, {"k1": b"one"})),
           (OP_QOS2_ADD, encode_mark_op(4, packet_id=5, entry=b"two")),
           (OP_STRANDED_ADD, encode_mark_op(5, "k3", b"three")),
           (OP_STRANDED_DEL, encode_texts("k1"))]
    try:
        await owner.svc.async_start()
        await link(wiring_of(na).svc, owner.svc)
        for op, payload in ops:
            owner.svc.replicate("na", "pub", op, payload, lambda seq, _status: acked.append(seq))
        await until(lambda: len(acked) == len(ops), "na committing the four operations")
        before = wiring_of(na).copies["pub"]
        expected = {f"{4:020d}/": b"two", "k3": b"three"}
        assert (before.mark, before.qos2, before.stranded) == (5, {5}, expected)
        await owner.svc.async_stop()
        await stop_node(na)

        na = await start_node(data, "na", ("nb",))
        after = wiring_of(na).copies["pub"]
        assert (after.mark, after.qos2, after.stranded) == (5, {5}, expected)
    finally:
        await owner.svc.async_stop()
        await stop_node(na)
