"""Session ownership and queue-replication encodings (pure): the "sessions" space value and Replicate op data.

"sessions" space: key = client id, value = SessionClaim (owner node, epoch, how it got the session, whether it is
persistent, its subscriptions). Among concurrent claims the greater (epoch, owner) wins (`claim_order`), so after a
heal every node agrees on one owner; a node that loses its claim closes the local connection with 0x8E.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from appliance.broker.model import Delivery, DeliveryState, SessionRecord, SubscriptionOptions

from .errors import WireError
from .records import decode_delivery, decode_session, decode_subscriptions, encode_delivery, encode_session
from .records import encode_subscriptions as _encode_subs
from .wire import _Reader, _Writer

FRESH, MIGRATED, FROM_REPLICA = 0, 1, 2  # SessionClaim.origin

# Replicate.op codes: owner -> replica queue operations.
OP_SNAPSHOT = 1  # the whole session (record, queue, QoS2 ids): replaces the replica's copy
OP_SESSION = 2  # the record (with subscriptions) changed
OP_ENQUEUE = 3
OP_UPDATE = 4  # a delivery's state / packet id
OP_REMOVE = 5
OP_DROP = 6  # the session ended or moved away from this owner
OP_QOS2_ADD = 7
OP_QOS2_DEL = 8


@dataclass(slots=True)
class SessionClaim:
    """Who owns a client id's session cluster-wide, and its subscriptions (for routing)."""

    owner: str
    epoch: float  # wall clock of the claim
    origin: int = FRESH
    persistent: bool = False
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
    # Lineage: earlier owners whose state this session continues (resumed from a copy of it, or handed over), each
    # with the queue seq below which that state held all of their deliveries. A stale earlier owner whose claim
    # loses hands over only what lies at or above its base.
    bases: dict[str, int] = field(default_factory=dict)


def encode_claim(claim: SessionClaim) -> bytes:
    """Value of the sessions space; the epoch comes first so that bytes order follows time for equal owners."""
    w = _Writer()
    w.f64(claim.epoch)
    w.text(claim.owner)
    w.uint(claim.origin)
    w.uint(1 if claim.persistent else 0)
    w.raw(_encode_subs(claim.subscriptions))
    if claim.bases:
        w.uint(len(claim.bases))
        for node, base in claim.bases.items():
            w.text(node)
            w.uint(base)
    return bytes(w.out)


def decode_claim(data: bytes) -> SessionClaim:
    """Inverse of encode_claim."""
    r = _Reader(data)
    epoch = r.f64()
    owner = r.text()
    origin = r.uint()
    persistent = bool(r.uint())
    subs = decode_subscriptions(r.raw())
    bases: dict[str, int] = {}
    if r.pos < len(data):  # claims written before the lineage existed end here
        for _ in range(r.uint()):
            node = r.text()
            bases[node] = r.uint()
    if r.pos != len(data):
        raise WireError("trailing bytes after a session claim")
    return SessionClaim(owner, epoch, origin, persistent, subs, bases)


COPY_SEEN_MAX = 16384  # message ids a replica copy remembers
LINEAGE_MAX = 16  # earlier owners remembered in a claim (an older one hands over its whole stale queue)


def extend_lineage(bases: dict[str, int], node: str, base: int) -> dict[str, int]:
    """A lineage continued from `node`'s state, which held its deliveries below `base` (the latest last)."""
    out = {n: b for n, b in bases.items() if n != node}
    out[node] = base
    while len(out) > LINEAGE_MAX:
        del out[next(iter(out))]
    return out


def hands_over(claim: SessionClaim, loser: str, seq: int) -> bool:
    """Whether a node whose claim lost to `claim` must hand the winner its queued delivery `seq`: all of them,
    unless the winner continues the loser's own state, which already held every delivery below the loser's base."""
    base = claim.bases.get(loser) if claim.origin != FRESH else None
    return base is None or seq >= base


def claim_order(value: bytes) -> tuple[float, str]:
    """resolve() order key: the latest claim wins, then the greater node id."""
    claim = decode_claim(value)
    return claim.epoch, claim.owner


@dataclass(slots=True)
class ReplicaCopy:
    """What a replica holds of one session owned elsewhere."""

    owner: str
    epoch: float
    record: SessionRecord
    queue: dict[int, Delivery | bytes] = field(default_factory=dict)  # seq -> delivery (or its encoding, lazily)
    qos2: set[int] = field(default_factory=set)
    version: int = 0  # operations applied, to pick the freshest copy
    last: int | None = field(default=None, compare=False)  # seq of the delivery the last OP_ENQUEUE added
    # ids of the messages the owner queued lately, acknowledged ones included (in memory only): a session resumed
    # from this copy drops a retargeted forward it already had
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict, compare=False)
    # wall clock of the last operation applied (set by the replica): among copies of the same claim and queue
    # position, the one its owner still fed last is the freshest (`version` counts operations of one copy only and
    # is not comparable across copies: an abandoned copy may have applied more)
    touched: float = field(default=0.0, compare=False)

    def note(self, msg_id: str) -> None:
        """Remember one queued message id (bounded)."""
        self.seen[msg_id] = None
        if len(self.seen) > COPY_SEEN_MAX:
            self.seen.popitem(last=False)

    def delivery(self, seq: int) -> Delivery:
        """One queued delivery, decoded (and kept decoded)."""
        value = self.queue[seq]
        if isinstance(value, bytes):
            value = self.queue[seq] = decode_delivery(value)
        return value

    def deliveries(self) -> list[Delivery]:
        """The whole queue in seq order, decoded."""
        return [self.delivery(seq) for seq in sorted(self.queue)]

    def encoded(self, seq: int) -> bytes:
        """One queued delivery as stored (encode_delivery)."""
        value = self.queue[seq]
        return value if isinstance(value, bytes) else encode_delivery(value)


def encode_snapshot(epoch: float, record: SessionRecord, queue: list[Delivery], qos2: list[int]) -> bytes:
    """OP_SNAPSHOT data."""
    w = _Writer()
    w.f64(epoch)
    w.raw(encode_session(record, queue))
    w.uint(len(qos2))
    for pid in qos2:
        w.uint(pid)
    return bytes(w.out)


def decode_snapshot(data: bytes) -> tuple[float, SessionRecord, list[Delivery], list[int]]:
    """Inverse of encode_snapshot."""
    r = _Reader(data)
    epoch = r.f64()
    record, queue = decode_session(r.raw())
    qos2 = [r.uint() for _ in range(r.uint())]
    return epoch, record, queue, qos2


def encode_handover(epoch: float, record: SessionRecord, queue: list[Delivery], qos2: list[int],
                    seen: list[str]) -> bytes:
    """A session handed to the node taking it over: the snapshot plus the ids of messages recently queued for it
    (oldest first), so that a forward retargeted to the new owner after it was delivered here is not repeated."""
    w = _Writer()
    w.raw(encode_snapshot(epoch, record, queue, qos2))
    w.uint(len(seen))
    for msg_id in seen:
        w.text(msg_id)
    return bytes(w.out)


def decode_handover(data: bytes) -> tuple[float, SessionRecord, list[Delivery], list[int], list[str]]:
    """Inverse of encode_handover."""
    r = _Reader(data)
    epoch, record, queue, qos2 = decode_snapshot(r.raw())
    seen = [r.text() for _ in range(r.uint())]
    if r.pos != len(data):
        raise WireError("trailing bytes after a session hand-over")
    return epoch, record, queue, qos2, seen


def encode_record(epoch: float, record: SessionRecord) -> bytes:
    """OP_SESSION data."""
    return encode_snapshot(epoch, record, [], [])


def encode_update(seq: int, state: DeliveryState, packet_id: int | None) -> bytes:
    """OP_UPDATE data."""
    w = _Writer()
    w.uint(seq)
    w.uint(int(state))
    w.uint(packet_id or 0)
    return bytes(w.out)


def decode_update(data: bytes) -> tuple[int, DeliveryState, int | None]:
    """Inverse of encode_update."""
    r = _Reader(data)
    seq, state, pid = r.uint(), DeliveryState(r.uint()), r.uint()
    return seq, state, pid or None


def encode_uint(n: int) -> bytes:
    """OP_REMOVE / OP_QOS2_* data."""
    w = _Writer()
    w.uint(n)
    return bytes(w.out)


def decode_uint(data: bytes) -> int:
    """Inverse of encode_uint."""
    return _Reader(data).uint()


def apply_op(copy: ReplicaCopy | None, owner: str, op: int, data: bytes) -> ReplicaCopy | None:
    """A replica applies one operation from `owner`; returns the new copy (None: dropped). Operations from a node
    that is not the copy's owner are ignored, except a snapshot / record with a newer epoch (a new owner)."""
    if op in (OP_SNAPSHOT, OP_SESSION):
        epoch, record, queue, qos2 = decode_snapshot(data)
        if copy is not None and copy.owner != owner and epoch < copy.epoch:
            return copy  # a stale owner (e.g. restarted after losing the session) must not overwrite
        if op == OP_SESSION and copy is not None and copy.owner == owner:
            copy.record, copy.epoch = record, epoch
        else:
            seen = copy.seen if copy is not None and copy.owner == owner else OrderedDict[str, None]()
            copy = ReplicaCopy(owner, epoch, record, {d.seq: d for d in queue}, set(qos2), seen=seen)
            for d in queue:
                copy.note(d.message.msg_id)
        copy.version += 1
        return copy
    if copy is None or copy.owner != owner:
        return copy
    copy.version += 1
    if op == OP_ENQUEUE:
        r = _Reader(data)  # the replica stores the bytes; only a takeover decodes them
        r.uint()  # format
        seq = r.uint()
        copy.note(r.text())  # the message id comes first in the encoded message
        copy.queue[seq] = data
        copy.last = seq
        copy.record.next_seq = max(copy.record.next_seq, seq + 1)  # the freshest copy has seen the latest enqueue
    elif op == OP_UPDATE:
        seq, state, pid = decode_update(data)
        if seq in copy.queue:
            found = copy.delivery(seq)
            found.state, found.packet_id = state, pid
    elif op == OP_REMOVE:
        copy.queue.pop(decode_uint(data), None)
    elif op == OP_QOS2_ADD:
        copy.qos2.add(decode_uint(data))
    elif op == OP_QOS2_DEL:
        copy.qos2.discard(decode_uint(data))
    elif op == OP_DROP:
        return None
    return copy


def queue_position(copy: ReplicaCopy) -> int:
    """The owner's next queue seq as far as this copy saw it (every delivery below it is reflected in the copy)."""
    return max([copy.record.next_seq, *(seq + 1 for seq in copy.queue)])


def freshest(copies: list[ReplicaCopy]) -> ReplicaCopy:
    """The copy to resume a session from: latest claim, then furthest queue position, then fed last by its owner."""
    return max(copies, key=lambda c: (c.epoch, queue_position(c), c.touched, c.version))


def encode_copy(copy: ReplicaCopy) -> bytes:
    """A replica copy as one durable value (owner, version, snapshot)."""
    w = _Writer()
    w.text(copy.owner)
    w.uint(copy.version)
    w.raw(encode_snapshot(copy.epoch, copy.record, copy.deliveries(), sorted(copy.qos2)))
    w.f64(copy.touched)
    if copy.seen:
        w.uint(len(copy.seen))
        for msg_id in copy.seen:
            w.text(msg_id)
    return bytes(w.out)


def decode_copy(data: bytes) -> ReplicaCopy:
    """Inverse of encode_copy."""
    r = _Reader(data)
    owner, version = r.text(), r.uint()
    epoch, record, queue, qos2 = decode_snapshot(r.raw())
    seen = OrderedDict[str, None]()
    touched = r.f64() if r.pos < len(data) else 0.0
    if r.pos < len(data):  # a durable header row carries no ids
        seen.update((r.text(), None) for _ in range(r.uint()))
    return ReplicaCopy(owner, epoch, record, dict[int, Delivery | bytes]({d.seq: d for d in queue}), set(qos2),
                       version, seen=seen, touched=touched)


__all__ = [
    "ReplicaCopy",
    "SessionClaim",
    "apply_op",
    "claim_order",
    "decode_claim",
    "decode_copy",
    "decode_handover",
    "encode_claim",
    "encode_copy",
    "encode_delivery",
    "encode_handover",
    "encode_snapshot",
    "encode_uint",
    "encode_update",
    "extend_lineage",
    "freshest",
    "hands_over",
    "queue_position",
]
