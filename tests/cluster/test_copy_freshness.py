"""Which replica copy a session resumes from (chaos seed 30347, a QoS2 duplicate on 74b67a8). node2, isolated, moved
pub3's replica off node0 (down) and, once node1 was back, onto node1 (a snapshot); node1 then held pub3#330's packet
id. node0's link came back 0.75 s later: node2 resent node0 the operations the isolation had left unacknowledged,
and node0's abandoned copy applied them (its `touched`, the replica's wall clock, became the latest); node2 was
SIGKILLed 0.1 s later. node1 resumed pub3 from node0's copy, which lacked #330's id, so the DUP resend was routed as
new. (An abandoned copy now also gets OP_DROP, after those operations.) The owner's ingress mark, which the
snapshot to the current replica carries at its latest value, orders copies of one claim by what their owner sent
last, not by when a replica applied it.
"""

from __future__ import annotations

from appliance.broker.model import SessionRecord
from appliance.cluster.ownership import (
    OP_QOS2_ADD,
    OP_SNAPSHOT,
    OP_STRANDED_DEL,
    apply_op,
    encode_mark_op,
    encode_snapshot,
    encode_texts,
    freshest,
)


def test_the_copy_resumed_from_is_the_one_with_the_owners_latest_mark_not_the_one_applied_last() -> None:
    """node0's copy: placed at mark 100, then (resent late) a pending message of mark 150 and its release; node1's
    copy: placed by a snapshot at mark 200, then #330's packet id (mark 210). node0's copy applied last."""
    record = SessionRecord("pub3", 1, 3600)
    abandoned = apply_op(None, "node2", OP_SNAPSHOT, encode_snapshot(10.0, record, [], [], 100))
    current = apply_op(None, "node2", OP_SNAPSHOT, encode_snapshot(10.0, record, [], [], 200))
    current = apply_op(current, "node2", OP_QOS2_ADD, encode_mark_op(210, packet_id=330))
    assert current is not None
    current.touched = 34.80  # node1's clock when it applied #330's id
    for op, data in ((OP_QOS2_ADD, encode_mark_op(150, packet_id=12, entry=b"m12")),
                     (OP_STRANDED_DEL, encode_texts(f"{150:020d}/"))):
        abandoned = apply_op(abandoned, "node2", op, data)
    assert abandoned is not None
    abandoned.touched = 34.90  # node0's clock when the resent operations arrived

    assert freshest([abandoned, current]) is current
    assert 330 in current.qos2
