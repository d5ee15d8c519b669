"""Acknowledged inter-node streams (sans-I/O): per-peer ordered Forward (and Replicate) messages with acks.

Sender: every forwarded message gets the next sequence number of that peer's stream and stays in the in-transit
buffer (which the caller also keeps durably, with `next_seq`) until the peer's cumulative ForwardAck covers it; on
every (re)connect the whole buffer is resent in order. Receiver: drops what it has already accepted (by sequence),
and acks a sequence only once its own durable enqueue of everything up to it is done. The same stream carries the
owner -> replica queue operations of issue 4 (ReplicaSender / ReplicaReceiver), whose acks may carry a refusal.

AckGate joins the acks one publisher's PUBACK / PUBREC waits for: the local commit and each target node's ack, or,
per the netsplit policy, the knowledge that a target is down.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from appliance.broker.model import Message

from .wire import Forward, ForwardAck, ReplAck, Replicate

OnAcked = Callable[[int, int], None]  # (seq, status): status 0 = committed by the peer, else its refusal code
M = TypeVar("M", Forward, Replicate)


@dataclass(slots=True)
class _InTransit(Generic[M]):
    """One buffered message and who waits for its ack."""

    message: M
    queued_at: float
    waiters: list[OnAcked] = field(default_factory=list)


class StreamSender(Generic[M]):
    """The sending side of one peer's ordered stream. Restore with the durable buffer and next_seq after a restart."""

    def __init__(self, peer: str, *, next_seq: int = 1, in_transit: Iterable[M] = ()) -> None:
        self.peer = peer
        self.next_seq = next_seq
        self._buffer: OrderedDict[int, _InTransit[M]] = OrderedDict()
        now = time.monotonic()
        for msg in sorted(in_transit, key=lambda m: m.seq):
            self._buffer[msg.seq] = _InTransit(msg, now)
            self.next_seq = max(self.next_seq, msg.seq + 1)

    def submit_with(self, make: Callable[[int], M], on_acked: OnAcked | None = None) -> M:
        """Build the next message from its sequence number and buffer it; return it to persist and send."""
        msg = make(self.next_seq)
        self.next_seq += 1
        entry = _InTransit(msg, time.monotonic())
        if on_acked is not None:
            entry.waiters.append(on_acked)
        self._buffer[msg.seq] = entry
        return msg

    def release(self, upto: int, status: int = 0) -> list[M]:
        """Release everything up to `upto` (cumulative); waiters of `upto` get `status`, earlier ones 0."""
        released: list[M] = []
        while self._buffer:
            seq, entry = next(iter(self._buffer.items()))
            if seq > upto:
                break
            del self._buffer[seq]
            released.append(entry.message)
            for waiter in entry.waiters:
                waiter(seq, status if seq == upto else 0)
        return released

    def resend(self) -> list[M]:
        """Everything still unacknowledged, oldest first: send it all again on a new link."""
        return [e.message for e in self._buffer.values()]

    def retarget(self, seqs: Iterable[int]) -> list[tuple[M, list[OnAcked]]]:
        """Take buffered messages out of this stream (e.g. their subscriber moved); the caller resubmits them."""
        taken = []
        for seq in seqs:
            entry = self._buffer.pop(seq, None)
            if entry is not None:
                taken.append((entry.message, entry.waiters))
        return taken

    @property
    def in_transit(self) -> int:
        """Messages sent or queued but not acknowledged."""
        return len(self._buffer)

    def lag(self, now: float | None = None) -> float:
        """Age in seconds of the oldest unacknowledged message (0 when none): the link lag `cluster show` prints."""
        if not self._buffer:
            return 0.0
        oldest = next(iter(self._buffer.values()))
        return (time.monotonic() if now is None else now) - oldest.queued_at


class ForwardSender(StreamSender[Forward]):
    """A peer's stream of forwarded publications."""

    def submit(self, message: Message, clients: tuple[str, ...] = (), on_acked: OnAcked | None = None) -> Forward:
        """Buffer a message for the peer; return the Forward to persist and send."""
        return self.submit_with(lambda seq: Forward(seq, message, clients), on_acked)

    def on_ack(self, ack: ForwardAck) -> list[Forward]:
        """Release what the peer's cumulative ack covers; return the released Forwards."""
        return self.release(ack.seq)

    def narrow(self, seq: int, client: str) -> Forward | None:
        """Stop naming `client` in a buffered forward that names others too: same seq, same place in the stream, so
        the others still get it in order; return the narrowed Forward (None if it is no longer buffered)."""
        entry = self._buffer.get(seq)
        if entry is None:
            return None
        fwd = entry.message
        entry.message = Forward(fwd.seq, fwd.message, tuple(c for c in fwd.clients if c != client))
        return entry.message


class ReplicaSender(StreamSender[Replicate]):
    """Owner -> one replica: the stream of queue operations (issue 4's synchronous queue replication)."""

    def submit(self, client_id: str, op: int, data: bytes, on_acked: OnAcked | None = None) -> Replicate:
        """Buffer one operation; return the Replicate to persist and send."""
        return self.submit_with(lambda seq: Replicate(seq, client_id, op, data), on_acked)

    def on_ack(self, ack: ReplAck) -> list[Replicate]:
        """Release what the replica's cumulative ack covers (ack.status belongs to ack.seq only)."""
        return self.release(ack.seq, ack.status)


class StreamReceiver:
    """The receiving side of one peer's stream. Restore `committed_upto` (persisted with each enqueue)."""

    def __init__(self, peer: str, *, committed_upto: int = 0) -> None:
        self.peer = peer
        self.committed_upto = committed_upto  # every seq <= this is durably processed here
        self.accepted_upto = committed_upto  # every seq <= this is processed or being processed
        self._uncommitted: deque[int] = deque()  # accepted, commit pending, ascending
        self._pending: set[int] = set()  # the same seqs, for O(1) membership
        self._done: dict[int, int] = {}  # committed seq -> status, waiting for the prefix

    def accept(self, msg: Forward | Replicate) -> bool:
        """True: new, process it durably then call committed(seq). False: a duplicate (resend) to drop."""
        if msg.seq <= self.accepted_upto:
            return False
        # A gap means the sender released those (acked by a previous incarnation of ours, or retargeted).
        self.accepted_upto = msg.seq
        self._uncommitted.append(msg.seq)
        self._pending.add(msg.seq)
        return True

    def _advance(self, seq: int, status: int) -> list[tuple[int, int]]:
        """Mark seq committed; return the (seq, status) acks now due: each refusal in the grown prefix, then its end."""
        if seq not in self._pending:
            return []  # unknown or already committed
        self._pending.discard(seq)
        self._done[seq] = status
        before = self.committed_upto
        due: list[tuple[int, int]] = []
        while self._uncommitted and self._uncommitted[0] in self._done:
            head = self._uncommitted.popleft()
            head_status = self._done.pop(head)
            self.committed_upto = head
            if head_status:
                due.append((head, head_status))
        if self.committed_upto == before:
            return []
        if not due or due[-1][0] != self.committed_upto:
            due.append((self.committed_upto, 0))
        return due


class ForwardReceiver(StreamReceiver):
    """The receiving side of a peer's forwarding stream."""

    def committed(self, seq: int) -> ForwardAck | None:
        """The durable enqueue of `seq` finished; return the cumulative ack to send if the acked prefix grew."""
        acks = self._advance(seq, 0)
        return ForwardAck(acks[-1][0]) if acks else None

    def duplicate_ack(self) -> ForwardAck | None:
        """The ack to re-send after dropping duplicates (tells a resending sender what is already safe here)."""
        return ForwardAck(self.committed_upto) if self.committed_upto else None


class ReplicaReceiver(StreamReceiver):
    """The receiving side of an owner's replication stream."""

    def committed(self, seq: int, status: int = 0) -> list[ReplAck]:
        """Operation `seq` committed (status 0) or refused (a reason code); return the acks to send, in order."""
        return [ReplAck(s, st) for s, st in self._advance(seq, status)]

    def committed_through(self, seq: int) -> list[ReplAck]:
        """Every accepted operation up to `seq` committed (status 0): the acks to send (a batch commits as one)."""
        uncommitted, pending, done = self._uncommitted, self._pending, self._done
        last = 0
        for head in uncommitted:
            if head > seq:
                break
            if head in pending:
                pending.discard(head)
                done[head] = 0
                last = head
        if not last:
            return []
        pending.add(last)  # _advance marks it once more and walks the prefix
        del done[last]
        return [ReplAck(s, st) for s, st in self._advance(last, 0)]

    def duplicate_ack(self) -> ReplAck | None:
        """The ack to re-send after dropping duplicates."""
        return ReplAck(self.committed_upto) if self.committed_upto else None


class AckGate:
    """Everything one publisher's PUBACK / PUBREC waits for; calls on_done(ok) exactly once."""

    def __init__(self, targets: Iterable[str], on_done: Callable[[bool], None], local: bool = True) -> None:
        self.waiting: set[str] = set(targets)
        self.local_pending = local
        self.ok = True
        self.finished = False
        self._on_done = on_done
        self._check()

    def local_committed(self) -> None:
        """The local durable commit is done."""
        self.local_pending = False
        self._check()

    def peer_acked(self, peer: str) -> None:
        """A target node acked its durable enqueue."""
        self.waiting.discard(peer)
        self._check()

    def peer_unreachable(self, peer: str, accept: bool) -> None:
        """A target is known down: `accept` (netsplit policy allows it) counts it done, else the gate fails."""
        if peer not in self.waiting:
            return
        self.waiting.discard(peer)
        if not accept:
            self.ok = False
        self._check()

    def _check(self) -> None:
        """Fire on_done when nothing is pending (or at once on failure)."""
        if self.finished:
            return
        if not self.ok or (not self.local_pending and not self.waiting):
            self.finished = True
            self._on_done(self.ok)
