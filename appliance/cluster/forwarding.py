"""Acknowledged inter-node forwarding (sans-I/O): a per-peer ordered stream of Forward messages.

Sender: every forwarded message gets the next sequence number of that peer's stream and stays in the in-transit
buffer (which the caller also keeps durably, with `next_seq`) until the peer's cumulative ForwardAck covers it; on
every (re)connect the whole buffer is resent in order. Receiver: drops what it has already accepted (by sequence),
and acks a sequence only once its own durable enqueue of everything up to it is done.

AckGate joins the acks one publisher's PUBACK / PUBREC waits for: the local commit and each target node's ack, or,
per the netsplit policy, the knowledge that a target is down.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from appliance.broker.model import Message

from .wire import Forward, ForwardAck

OnAcked = Callable[[int], None]


@dataclass(slots=True)
class _InTransit:
    """One buffered Forward and who waits for its ack."""

    forward: Forward
    queued_at: float
    waiters: list[OnAcked] = field(default_factory=list)


class ForwardSender:
    """The sending side of one peer's stream. Restore with the durable buffer and next_seq after a restart."""

    def __init__(self, peer: str, *, next_seq: int = 1, in_transit: Iterable[Forward] = ()) -> None:
        self.peer = peer
        self.next_seq = next_seq
        self._buffer: OrderedDict[int, _InTransit] = OrderedDict()
        now = time.monotonic()
        for fwd in sorted(in_transit, key=lambda f: f.seq):
            self._buffer[fwd.seq] = _InTransit(fwd, now)
            self.next_seq = max(self.next_seq, fwd.seq + 1)

    def submit(self, message: Message, clients: tuple[str, ...] = (), on_acked: OnAcked | None = None) -> Forward:
        """Assign the next sequence number and buffer the message; return the Forward to persist and send."""
        fwd = Forward(self.next_seq, message, clients)
        self.next_seq += 1
        entry = _InTransit(fwd, time.monotonic())
        if on_acked is not None:
            entry.waiters.append(on_acked)
        self._buffer[fwd.seq] = entry
        return fwd

    def on_ack(self, ack: ForwardAck) -> list[Forward]:
        """Release everything up to ack.seq (cumulative); call each one's waiters; return the released Forwards."""
        released: list[Forward] = []
        while self._buffer:
            seq, entry = next(iter(self._buffer.items()))
            if seq > ack.seq:
                break
            del self._buffer[seq]
            released.append(entry.forward)
            for waiter in entry.waiters:
                waiter(seq)
        return released

    def resend(self) -> list[Forward]:
        """Everything still unacknowledged, oldest first: send it all again on a new link."""
        return [e.forward for e in self._buffer.values()]

    def retarget(self, seqs: Iterable[int]) -> list[tuple[Forward, list[OnAcked]]]:
        """Take buffered messages out of this stream (their subscriber moved elsewhere); the caller resubmits them."""
        taken = []
        for seq in seqs:
            entry = self._buffer.pop(seq, None)
            if entry is not None:
                taken.append((entry.forward, entry.waiters))
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


class ForwardReceiver:
    """The receiving side of one peer's stream. Restore `committed_upto` (persisted with each enqueue)."""

    def __init__(self, peer: str, *, committed_upto: int = 0) -> None:
        self.peer = peer
        self.committed_upto = committed_upto  # every seq <= this is durably enqueued here
        self.accepted_upto = committed_upto  # every seq <= this is enqueued or being enqueued
        self._uncommitted: list[int] = []  # accepted, commit pending, ascending
        self._done: set[int] = set()

    def accept(self, fwd: Forward) -> bool:
        """True: new, enqueue it durably then call committed(seq). False: a duplicate (resend) to drop."""
        if fwd.seq <= self.accepted_upto:
            return False
        # A gap means the sender released those (acked by a previous incarnation of ours, or retargeted).
        self.accepted_upto = fwd.seq
        self._uncommitted.append(fwd.seq)
        return True

    def committed(self, seq: int) -> ForwardAck | None:
        """The durable enqueue of `seq` finished; return the cumulative ack to send if the acked prefix grew."""
        self._done.add(seq)
        advanced = False
        while self._uncommitted and self._uncommitted[0] in self._done:
            head = self._uncommitted.pop(0)
            self._done.discard(head)
            self.committed_upto = head
            advanced = True
        return ForwardAck(self.committed_upto) if advanced else None

    def duplicate_ack(self) -> ForwardAck | None:
        """The ack to re-send after dropping duplicates (tells a resending sender what is already safe here)."""
        return ForwardAck(self.committed_upto) if self.committed_upto else None

    def link_lost(self) -> None:
        """Nothing to forget: accepted messages still commit and are acked on the next link (or re-sent to us)."""


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
