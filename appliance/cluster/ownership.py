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
OP_QOS2_ADD = 7  # an incoming QoS2 packet id, with the owner's ingress mark
OP_QOS2_DEL = 8
OP_STRANDED_ADD = 9  # a message of this publisher acknowledged while its target node was unreachable (issue 4)
OP_STRANDED_DEL = 10  # the target node acknowledged it
OP_REMOVE_MANY = 11  # OP_REMOVE of several deliveries (the releases of one loop iteration)
OP_ENQUEUE_MANY = 12  # OP_ENQUEUE of several deliveries (the enqueues of one loop iteration), in order


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
    # Ingress marks: earlier owners whose replica copy this session resumed from (FROM_REPLICA), or that handed it
    # over (MIGRATED), each with the highest ingress mark that copy or hand-over reflected. A restarted earlier owner
    # sends on its durable forwards of an unconfirmed QoS2 message only if its mark is covered (the resumed session
    # knows the packet id); a message it acknowledged while the target was unreachable was passed on by the resumer.
    marks: dict[str, int] = field(default_factory=dict)


def encode_claim(claim: SessionClaim) -> bytes:
    """Value of the sessions space; the epoch comes first so that bytes order follows time for equal owners."""
    w = _Writer()
    w.f64(claim.epoch)
    w.text(claim.owner)
    w.uint(claim.origin)
    w.uint(1 if claim.persistent else 0)
    w.raw(_encode_subs(claim.subscriptions))
    if claim.bases or claim.marks:
        w.uint(len(claim.bases))
        for node, base in claim.bases.items():
            w.text(node)
            w.uint(base)
    if claim.marks:
        w.uint(len(claim.marks))
        for node, mark in claim.marks.items():
            w.text(node)
            w.uint(mark)
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
    marks: dict[str, int] = {}
    if r.pos < len(data):
        for _ in range(r.uint()):
            node = r.text()
            marks[node] = r.uint()
    if r.pos != len(data):
        raise WireError("trailing bytes after a session claim")
    return SessionClaim(owner, epoch, origin, persistent, subs, bases, marks)


COPY_SEEN_MAX = 16384  # message ids a replica copy remembers
LINEAGE_MAX = 16  # earlier owners remembered in a claim (an older one hands over its whole stale queue)


def extend_lineage(bases: dict[str, int], node: str, base: int) -> dict[str, int]:
    """A lineage continued from `node`'s state, which held its deliveries below `base` (the latest last)."""
    out = {n: b for n, b in bases.items() if n != node}
    out[node] = base
    while len(out) > LINEAGE_MAX:
        del out[next(iter(out))]
    return out


def extend_marks(marks: dict[str, int], node: str, mark: int) -> dict[str, int]:
    """Ingress marks continued from `node`'s state, which reflected its ingress up to `mark` (the latest last)."""
    out = {n: m for n, m in marks.items() if n != node}
    out[node] = mark
    while len(out) > LINEAGE_MAX:
        del out[next(iter(out))]
    return out


def keeps_forward(claim: SessionClaim | None, node: str, stranded: bool) -> bool:
    """Whether `node`, restarted, still sends its durable forwards (and keeps its queued copies) of a message that
    its publisher's session (now `claim`) had pending there: always while `node` still owns the session, never once
    a session resumed from `node`'s copy took the pending messages over. Otherwise a stranded one (acknowledged) is
    kept; an unacknowledged QoS2 one only if `node` handed the session over alive (the packet id went with it, so
    the publisher's resend is acknowledged, not routed again)."""
    if claim is None or claim.owner == node:
        return True
    if node in claim.marks:
        return False
    return stranded or node in claim.bases


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
    added: list[int] = field(default_factory=list, compare=False)  # seqs the last OP_ENQUEUE_MANY added
    # ids of the messages the owner queued lately, acknowledged ones included (in memory only): a session resumed
    # from this copy drops a retargeted forward it already had
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict, compare=False)
    # wall clock of the last operation applied (set by the replica): among copies of the same claim and queue
    # position, the one its owner still fed last is the freshest (`version` counts operations of one copy only and
    # is not comparable across copies: an abandoned copy may have applied more)
    touched: float = field(default=0.0, compare=False)
    mark: int = 0  # the owner's highest ingress mark reflected here (QoS2 ids and stranded messages)
    # messages of this publisher that the owner acknowledged while their target was unreachable, still in its
    # in-transit buffer: key -> an encoded Forward (a session resumed from this copy passes them on first)
    stranded: dict[str, bytes] = field(default_factory=dict, compare=False)

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


def encode_snapshot(epoch: float, record: SessionRecord, queue: list[Delivery], qos2: list[int], mark: int = 0,
                    stranded: dict[str, bytes] | None = None, seen: list[str] | None = None) -> bytes:
    """OP_SNAPSHOT data (the ingress mark, stranded messages and the owner's message-id memory, oldest first, are an
    optional tail)."""
    w = _Writer()
    w.f64(epoch)
    w.raw(encode_session(record, queue))
    w.uint(len(qos2))
    for pid in qos2:
        w.uint(pid)
    if mark or stranded or seen:
        w.uint(mark)
        w.uint(len(stranded or {}))
        for key, entry in (stranded or {}).items():
            w.text(key)
            w.raw(entry)
    if seen:
        w.uint(len(seen))
        for msg_id in seen:
            w.text(msg_id)
    return bytes(w.out)


def decode_snapshot(data: bytes) -> tuple[float, SessionRecord, list[Delivery], list[int]]:
    """Inverse of encode_snapshot (without the tail)."""
    epoch, record, queue, qos2, _mark, _stranded, _seen = decode_snapshot_full(data)
    return epoch, record, queue, qos2


def decode_snapshot_full(data: bytes) -> tuple[float, SessionRecord, list[Delivery], list[int], int,
                                                 dict[str, bytes], list[str]]:
    """Inverse of encode_snapshot, with the ingress mark, the stranded messages and the message-id memory."""
    r = _Reader(data)
    epoch = r.f64()
    record, queue = decode_session(r.raw())
    qos2 = [r.uint() for _ in range(r.uint())]
    mark, stranded, seen = 0, {}, []
    if r.pos < len(data):
        mark = r.uint()
        for _ in range(r.uint()):
            key = r.text()
            stranded[key] = r.raw()
    if r.pos < len(data):
        seen = [r.text() for _ in range(r.uint())]
    return epoch, record, queue, qos2, mark, stranded, seen


def encode_mark_op(mark: int, key: str = "", entry: bytes = b"", packet_id: int = 0) -> bytes:
    """OP_QOS2_ADD data (packet id, mark, optionally the message as an encoded Forward: pending under the key
    f"{mark:020d}/") or OP_STRANDED_ADD data (mark, key, encoded Forward)."""
    w = _Writer()
    if key:
        w.uint(mark)
        w.text(key)
        w.raw(entry)
    else:
        w.uint(packet_id)
        w.uint(mark)
        if entry:
            w.raw(entry)
    return bytes(w.out)


def decode_qos2_add(data: bytes) -> tuple[int, int, bytes]:
    """OP_QOS2_ADD data -> (packet id, mark, encoded Forward or b""); an op without a mark has mark 0."""
    r = _Reader(data)
    pid = r.uint()
    mark = r.uint() if r.pos < len(data) else 0
    return pid, mark, (r.raw() if r.pos < len(data) else b"")


Handing = tuple[str, bytes, bool]  # an unconfirmed hand-over: (taker, SessionState data, resumable by a third node)


def encode_handing(entry: Handing) -> bytes:
    """A hand-over its taker has not confirmed yet, as a KV value (the old owner keeps it across restarts)."""
    taker = entry[0].encode()
    return len(taker).to_bytes(2, "big") + taker + bytes([entry[2]]) + entry[1]


def decode_handing(value: bytes) -> Handing:
    """encode_handing's inverse."""
    n = int.from_bytes(value[:2], "big")
    return value[2 : 2 + n].decode(), value[3 + n :], bool(value[2 + n])


def decode_stranded_add(data: bytes) -> tuple[int, str, bytes]:
    """OP_STRANDED_ADD data -> (mark, key, encoded Forward)."""
    r = _Reader(data)
    return r.uint(), r.text(), r.raw()


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


def encode_texts(*texts: str) -> bytes:
    """Strings in order (OP_STRANDED_DEL data, the wiring's ingress-mark values)."""
    w = _Writer()
    for text in texts:
        w.text(text)
    return bytes(w.out)


def decode_text(data: bytes) -> str:
    """Inverse of encode_texts for one string."""
    return _Reader(data).text()


def decode_text_pair(data: bytes) -> tuple[str, str]:
    """Inverse of encode_texts for two strings."""
    r = _Reader(data)
    return r.text(), r.text()


def encode_uints(values: list[int]) -> bytes:
    """OP_REMOVE_MANY data."""
    w = _Writer()
    w.uint(len(values))
    for n in values:
        w.uint(n)
    return bytes(w.out)


def decode_uints(data: bytes) -> list[int]:
    """Inverse of encode_uints."""
    r = _Reader(data)
    return [r.uint() for _ in range(r.uint())]


def _enqueue_raw(copy: ReplicaCopy, data: bytes) -> int:
    """Add one encoded delivery to a copy; return its seq."""
    r = _Reader(data)  # the replica stores the bytes; only a takeover decodes them
    r.uint()  # format
    seq = r.uint()
    copy.note(r.text())  # the message id comes first in the encoded message
    copy.queue[seq] = data
    if seq >= copy.record.next_seq:
        copy.record.next_seq = seq + 1  # the freshest copy has seen the latest enqueue
    return seq


def encode_raws(items: list[bytes]) -> bytes:
    """OP_ENQUEUE_MANY data: encoded deliveries, in order."""
    w = _Writer()
    w.uint(len(items))
    for item in items:
        w.raw(item)
    return bytes(w.out)


def decode_raws(data: bytes) -> list[bytes]:
    """Inverse of encode_raws."""
    r = _Reader(data)
    return [r.raw() for _ in range(r.uint())]


def apply_op(copy: ReplicaCopy | None, owner: str, op: int, data: bytes) -> ReplicaCopy | None:
    """A replica applies one operation from `owner`; returns the new copy (None: dropped). Operations from a node
    that is not the copy's owner are ignored, except a snapshot / record with a newer epoch (a new owner)."""
    if op in (OP_SNAPSHOT, OP_SESSION):
        epoch, record, queue, qos2, mark, stranded, owner_seen = decode_snapshot_full(data)
        if copy is not None and copy.owner != owner and epoch < copy.epoch:
            return copy  # a stale owner (e.g. restarted after losing the session) must not overwrite
        if op == OP_SESSION and copy is not None and copy.owner == owner:
            copy.record, copy.epoch = record, epoch
        else:
            seen = copy.seen if copy is not None and copy.owner == owner else OrderedDict[str, None]()
            copy = ReplicaCopy(owner, epoch, record, {d.seq: d for d in queue}, set(qos2), seen=seen, mark=mark,
                               stranded=stranded)
            # The owner's memory first (ids it queued before this copy existed: acknowledged ones too, and those
            # a hand-over or resume brought it), then the queue: a session resumed from this copy drops them.
            for msg_id in owner_seen:
                copy.note(msg_id)
            for d in queue:
                copy.note(d.message.msg_id)
        copy.version += 1
        return copy
    if copy is None or copy.owner != owner:
        return copy
    copy.version += 1
    if op == OP_ENQUEUE:
        copy.last = _enqueue_raw(copy, data)
    elif op == OP_ENQUEUE_MANY:
        copy.added = [_enqueue_raw(copy, entry) for entry in decode_raws(data)]
    elif op == OP_UPDATE:
        seq, state, pid = decode_update(data)
        if seq in copy.queue:
            found = copy.delivery(seq)
            found.state, found.packet_id = state, pid
    elif op == OP_REMOVE:
        copy.queue.pop(decode_uint(data), None)
    elif op == OP_REMOVE_MANY:
        for seq in decode_uints(data):
            copy.queue.pop(seq, None)
    elif op == OP_QOS2_ADD:
        pid, mark, entry = decode_qos2_add(data)
        copy.qos2.add(pid)
        copy.mark = max(copy.mark, mark)
        if entry:
            copy.stranded[f"{mark:020d}/"] = entry
    elif op == OP_QOS2_DEL:
        copy.qos2.discard(decode_uint(data))
    elif op == OP_STRANDED_ADD:
        mark, key, entry = decode_stranded_add(data)
        copy.mark = max(copy.mark, mark)
        copy.stranded[key] = entry
    elif op == OP_STRANDED_DEL:
        copy.stranded.pop(decode_text(data), None)
    elif op == OP_DROP:
        return None
    return copy


def queue_position(copy: ReplicaCopy) -> int:
    """The owner's next queue seq as far as this copy saw it (every delivery below it is reflected in the copy)."""
    return max([copy.record.next_seq, *(seq + 1 for seq in copy.queue)])


def freshest(copies: list[ReplicaCopy]) -> ReplicaCopy:
    """The copy to resume a session from: latest claim, then furthest queue position, then fed last by its owner: the
    owner's latest ingress mark (the current replica's snapshot carries it; an abandoned copy applying late resends
    gets a later `touched` but no later mark: chaos 30347), then the replica's clock."""
    return max(copies, key=lambda c: (c.epoch, queue_position(c), c.mark, c.touched, c.version))


def encode_copy(copy: ReplicaCopy) -> bytes:
    """A replica copy as one durable value (owner, version, snapshot)."""
    w = _Writer()
    w.text(copy.owner)
    w.uint(copy.version)
    w.raw(encode_snapshot(copy.epoch, copy.record, copy.deliveries(), sorted(copy.qos2), copy.mark, copy.stranded))
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
    epoch, record, queue, qos2, mark, stranded, _seen = decode_snapshot_full(r.raw())
    seen = OrderedDict[str, None]()
    touched = r.f64() if r.pos < len(data) else 0.0
    if r.pos < len(data):  # a durable header row carries no ids
        seen.update((r.text(), None) for _ in range(r.uint()))
    return ReplicaCopy(owner, epoch, record, dict[int, Delivery | bytes]({d.seq: d for d in queue}), set(qos2),
                       version, seen=seen, touched=touched, mark=mark, stranded=stranded)


__all__ = [
    "Handing",
    "ReplicaCopy",
    "SessionClaim",
    "apply_op",
    "claim_order",
    "decode_claim",
    "decode_copy",
    "decode_handing",
    "decode_handover",
    "encode_claim",
    "encode_copy",
    "encode_delivery",
    "encode_handing",
    "encode_handover",
    "encode_snapshot",
    "encode_uint",
    "encode_update",
    "extend_lineage",
    "extend_marks",
    "freshest",
    "hands_over",
    "keeps_forward",
    "queue_position",
]
