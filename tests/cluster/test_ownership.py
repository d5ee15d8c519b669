"""Session claims and replica copies: encodings round-trip, the later claim wins, a replica applies only its
owner's operations and refuses a stale owner's snapshot."""

from __future__ import annotations

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.cluster import dvv
from appliance.cluster.ownership import (
    FRESH,
    FROM_REPLICA,
    LINEAGE_MAX,
    MIGRATED,
    OP_DROP,
    OP_ENQUEUE,
    OP_QOS2_ADD,
    OP_REMOVE,
    OP_SNAPSHOT,
    OP_UPDATE,
    ReplicaCopy,
    SessionClaim,
    apply_op,
    claim_order,
    decode_claim,
    decode_copy,
    encode_claim,
    encode_copy,
    encode_delivery,
    encode_snapshot,
    encode_uint,
    encode_update,
    extend_lineage,
    freshest,
    hands_over,
)


def _delivery(seq: int) -> Delivery:
    return Delivery(seq, Message(f"m{seq}", "t", f"p{seq}".encode(), 1, False, "pub", 1000.0 + seq), 1, False)


def test_claim_round_trip_and_latest_claim_wins_among_siblings() -> None:
    a = SessionClaim("na", 100.0, MIGRATED, True, {"t/#": SubscriptionOptions(qos=1)})
    b = SessionClaim("nb", 200.0)
    assert decode_claim(encode_claim(a)) == a
    clock = dvv.sync(dvv.update(dvv.DVVSet(), {}, encode_claim(a), "na"),
                     dvv.update(dvv.DVVSet(), {}, encode_claim(b), "nb"))  # concurrent: two siblings
    assert decode_claim(dvv.resolve(clock, claim_order) or b"").owner == "nb"


def test_a_losing_owner_hands_over_what_the_winner_lacks_by_lineage() -> None:
    """Chaos finding: after a heal, the owner whose claim lost handed over only messages created after the winner's
    claim, so what it had acknowledged alone during the split was lost. The winner's claim names the owners whose
    state it continues, with the queue seq below which that state was complete."""
    resumed = SessionClaim("na", 300.0, FROM_REPLICA, True, {}, extend_lineage({"nc": 7}, "nb", 40))
    assert decode_claim(encode_claim(resumed)) == resumed
    assert list(resumed.bases) == ["nc", "nb"]
    assert not hands_over(resumed, "nb", 39) and hands_over(resumed, "nb", 40)  # what the copy lacked
    assert not hands_over(resumed, "nc", 6) and hands_over(resumed, "nc", 7)  # an earlier owner of the chain
    assert all(hands_over(resumed, "nd", seq) for seq in (0, 39, 40))  # not in the lineage: everything
    fresh = SessionClaim("na", 300.0, FRESH, True, {}, {"nb": 40})
    assert hands_over(fresh, "nb", 0)  # a fresh session continues nobody
    long = {}
    for i in range(LINEAGE_MAX + 3):
        long = extend_lineage(long, f"n{i}", i)
    assert len(long) == LINEAGE_MAX and f"n{LINEAGE_MAX + 2}" in long and "n0" not in long
    assert list(extend_lineage({"na": 1, "nb": 2}, "na", 5)) == ["nb", "na"]  # the latest last


def test_the_freshest_copy_is_the_one_its_owner_fed_last_not_the_one_with_most_operations() -> None:
    """Chaos finding (QoS2 duplicate from a resumed publisher): a copy abandoned when placement moved (its node was
    down, so it never got OP_DROP) had applied more operations than the current replica, which started from a
    snapshot; `version` picked it, and it lacked the latest incoming QoS2 packet id."""
    record = SessionRecord("pub", 5, 3600)
    abandoned = ReplicaCopy("nb", 10.0, record, {}, {1, 2}, version=40, touched=100.0)
    current = ReplicaCopy("nb", 10.0, record, {}, {1, 2, 3}, version=2, touched=130.0)
    assert freshest([abandoned, current]) is current
    assert decode_copy(encode_copy(current)).touched == 130.0
    newer_claim = ReplicaCopy("nc", 11.0, record, {}, set(), version=1, touched=90.0)
    assert freshest([current, newer_claim]) is newer_claim  # a later claim wins whatever the clocks say


def test_a_snapshot_brings_the_owners_message_ids_to_a_new_copy() -> None:
    """Chaos 30033: a replica placed after a hand-over learnt only the queued ids from its snapshot; a session
    resumed from it took a message it had completed before as new. The owner's ids (oldest first) come along now,
    stranded messages still decode, and a snapshot without them (an older node's) still applies."""
    record = SessionRecord("s", 4, 3600)
    data = encode_snapshot(10.0, record, [_delivery(3)], [7], 5, {"k/": b"f"}, ["m1", "m2"])
    copy = apply_op(None, "na", OP_SNAPSHOT, data)
    assert copy is not None and list(copy.seen) == ["m1", "m2", "m3"]
    assert copy.stranded == {"k/": b"f"} and copy.mark == 5 and copy.qos2 == {7}
    only_ids = apply_op(None, "na", OP_SNAPSHOT, encode_snapshot(10.0, record, [], [], seen=["m9"]))
    assert only_ids is not None and list(only_ids.seen) == ["m9"] and only_ids.stranded == {}
    older = apply_op(None, "na", OP_SNAPSHOT, encode_snapshot(10.0, record, [_delivery(3)], []))
    assert older is not None and list(older.seen) == ["m3"]


def test_replica_applies_its_owners_operations_in_order() -> None:
    record = SessionRecord("s", 4, 3600, subscriptions={"t": SubscriptionOptions(qos=1)})
    copy = apply_op(None, "nc", OP_SNAPSHOT, encode_snapshot(10.0, record, [_delivery(1)], []))
    assert copy is not None
    for op, data in [(OP_ENQUEUE, encode_delivery(_delivery(2))), (OP_ENQUEUE, encode_delivery(_delivery(3))),
                     (OP_UPDATE, encode_update(2, DeliveryState.SENT, 9)), (OP_REMOVE, encode_uint(1)),
                     (OP_QOS2_ADD, encode_uint(4))]:
        copy = apply_op(copy, "nc", op, data)
        assert copy is not None
    assert sorted(copy.queue) == [2, 3] and copy.delivery(2).packet_id == 9 and copy.qos2 == {4}
    assert list(copy.seen) == ["m1", "m2", "m3"]  # removed m1 included: a resumed session drops a late copy of it
    assert list(decode_copy(encode_copy(copy)).seen) == ["m1", "m2", "m3"]
    assert [d.message.payload for d in copy.deliveries()] == [b"p2", b"p3"]
    again = decode_copy(encode_copy(copy))
    assert sorted(again.queue) == [2, 3] and again.version == copy.version and again.record.subscriptions
    # Another node's queue operations are ignored; a stale owner's older snapshot too.
    assert apply_op(copy, "na", OP_REMOVE, encode_uint(2)) is copy and 2 in copy.queue
    stale = apply_op(copy, "na", OP_SNAPSHOT, encode_snapshot(5.0, record, [], []))
    assert stale is copy and stale.owner == "nc"
    newer = apply_op(copy, "na", OP_SNAPSHOT, encode_snapshot(20.0, record, [], []))
    assert newer is not None and newer.owner == "na" and newer.queue == {}
    assert apply_op(newer, "na", OP_DROP, b"") is None
