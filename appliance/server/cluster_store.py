"""The broker's Store on a cluster node: SQLite underneath; after_commit also waits for peer acks; queue replication.

Every write goes to the SqliteStore in call order. Writes to a persistent session owned here are also sent to its
replicas (`on_session_op`). A forward or replica write that must be acknowledged registers a wait; the next
after_commit callback (a PUBACK, a SUBACK, a forward's ack...) runs only when the local commit and every wait
registered before it are done, in FIFO order (AckGate per callback). So an ack means: on disk here and on the peers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.broker.ports import Snapshot
from appliance.cluster.forwarding import AckGate
from appliance.cluster.ownership import (
    OP_DROP,
    OP_ENQUEUE,
    OP_QOS2_DEL,
    OP_REMOVE,
    OP_SESSION,
    OP_UPDATE,
    encode_delivery,
    encode_uint,
    encode_update,
)
from appliance.store import SqliteStore

SessionOp = Callable[[str, int, bytes, bool], None]  # (client id, op, data, must be acked before the next ack)
Enqueued = Callable[[str, Delivery], None]
IsQos2 = Callable[[str, int | None], bool]  # (client id, packet id): that outbound delivery is QoS2


Wait = tuple[str, int, str]  # (peer, stream seq or batch id, "f" forward / "r" replica / "b" batched replica writes)


class _Gated:
    """One after_commit callback waiting for its gate."""

    __slots__ = ("args", "callback", "gate", "ordered", "pending", "ran")

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], waits: list[Wait], ordered: bool) -> None:
        self.callback = callback
        self.args = args
        self.pending: dict[str, int] = {}  # peer -> acks still outstanding
        for peer, _seq, _kind in waits:
            self.pending[peer] = self.pending.get(peer, 0) + 1
        self.ordered = ordered  # client acks keep FIFO order; cluster-internal acks run as soon as they are due
        self.ran = False
        self.gate = AckGate(self.pending, _nothing)

    def settle(self, peer: str, reachable: bool) -> bool:
        """One wait on `peer` is over (acked, or the peer is down and the policy accepts it); True once finished."""
        left = self.pending.get(peer, 0) - 1
        self.pending[peer] = left
        if left <= 0:
            if reachable:
                self.gate.peer_acked(peer)
            else:
                self.gate.peer_unreachable(peer, True)
        return self.gate.finished


def _nothing(_ok: bool) -> None:
    """AckGate's on_done: the FIFO checks gate.finished itself."""


class ClusterStore:
    """A Store (appliance.broker.ports) for a cluster node."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.on_session_op: SessionOp | None = None
        self.on_enqueued: Enqueued | None = None
        self.is_qos2: IsQos2 | None = None
        self.on_qos2_added: Callable[[str, int], None] | None = None
        self._fifo: deque[_Gated] = deque()
        self._open: dict[Wait, list[_Gated]] = {}  # outstanding wait -> the callbacks it gates
        self._unbound: dict[Wait, None] = {}  # waits registered since the last after_commit, in order
        self._capture: list[Wait] | None = None  # waits of the cluster-internal ack being prepared
        self._bound_before: set[Wait] | None = None  # client-ack waits pending when the capture began
        self._tracks: list[list[Wait]] = []  # lists filled by track() with every wait registered meanwhile

    # -- waits ---------------------------------------------------------------------------------------------------
    def add_wait(self, peer: str, seq: int, kind: str) -> None:
        """The next after_commit (and a capturing after_own_acks) waits for (peer, seq) of stream `kind`."""
        key = (peer, seq, kind)
        if key not in self._open:  # a batched replica write is one wait for several writes
            self._open[key] = []
        self._unbound[key] = None
        if self._capture is not None:
            self._capture.append(key)
        for tracked in self._tracks:
            tracked.append(key)

    def chain_wait(self, old: Wait, new: Wait) -> None:
        """Whatever waits for `old` also waits for `new` (registered outside the FIFO's order)."""
        gates = self._open.get(old)
        if not gates:
            return
        self._open.setdefault(new, []).extend(gates)
        for entry in gates:
            entry.pending[new[0]] = entry.pending.get(new[0], 0) + 1
            entry.gate.waiting.add(new[0])

    def track(self) -> list[Wait]:
        """A list that gets every wait registered (batched ones included, each time) until untrack(list)."""
        tracked: list[Wait] = []
        self._tracks.append(tracked)
        return tracked

    def untrack(self, tracked: list[Wait]) -> None:
        """Stop filling a list returned by track()."""
        self._tracks.remove(tracked)

    def open_waits(self, peer: str, kinds: str) -> list[Wait]:
        """The outstanding waits on `peer` of the given stream kinds that gate a callback."""
        return [k for k, gates in self._open.items() if k[0] == peer and k[2] in kinds and gates]

    def begin_own_acks(self) -> None:
        """Start collecting the waits that the next after_own_acks callback must wait for."""
        self._capture = []
        self._bound_before = set(self._unbound) if self._unbound else None

    def wait_done(self, peer: str, seq: int, kind: str) -> None:
        """A stream ack covered (peer, seq)."""
        self._settle((peer, seq, kind), True)

    def peer_down(self, peer: str, kind: str) -> None:
        """Policy accepts the loss of `peer`: its waits of stream `kind` count as done (the data stays buffered)."""
        for key in [k for k in self._open if k[0] == peer and k[2] == kind]:
            self._settle(key, False)

    def _settle(self, key: Wait, reachable: bool) -> None:
        gates = self._open.pop(key, None)
        if gates is None:
            return
        self._unbound.pop(key, None)
        for entry in gates:
            if entry.settle(key[0], reachable):
                self._drain(entry)

    @property
    def gated(self) -> int:
        """Callbacks waiting for peer acks."""
        return len(self._fifo)

    def _local_done(self, entry: _Gated) -> None:
        entry.gate.local_committed()
        self._drain(entry)

    def _drain(self, entry: _Gated) -> None:
        """Run an unordered callback now that it is due; run finished ordered callbacks from the head, in order."""
        if not entry.ordered:
            if entry.gate.finished and not entry.ran:
                entry.ran = True
                entry.callback(*entry.args)
            return
        fifo = self._fifo
        while fifo and fifo[0].gate.finished:
            head = fifo.popleft()
            head.ran = True
            head.callback(*head.args)

    # -- Store protocol ------------------------------------------------------------------------------------------
    def after_commit(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run callback once everything queued before is committed here and acknowledged by the peers."""
        if not self._unbound and not self._fifo:
            self.inner.after_commit(callback, *args)
            return
        waits = list(self._unbound)
        self._unbound = {}
        self._gate(callback, args, waits, True)

    def after_own_acks(self, callback: Callable[..., Any], *args: Any) -> None:
        """For cluster-internal acks: wait for the local commit and the waits captured since begin_own_acks (even
        those a client ack also waits for), but not behind client acks (two nodes would wait on each other)."""
        waits = list(dict.fromkeys(k for k in (self._capture or ()) if k in self._open))
        self._capture = None
        if not waits:
            self.inner.after_commit(callback, *args)
            return
        before = self._bound_before
        for key in waits:
            if before is None or key not in before:  # a shared (batched) wait a client ack still needs stays
                self._unbound.pop(key, None)
        self._gate(callback, args, waits, False)

    def _gate(self, callback: Callable[..., Any], args: tuple[Any, ...], waits: list[Wait], ordered: bool) -> None:
        entry = _Gated(callback, args, waits, ordered)
        for key in waits:
            self._open[key].append(entry)
        if ordered:
            self._fifo.append(entry)
        self.inner.after_commit(self._local_done, entry)

    def load(self) -> Snapshot:
        """The SQLite snapshot."""
        return self.inner.load()

    def _op(self, client_id: str, op: int, data: bytes | None = None, acked: bool = False) -> None:
        hook = self.on_session_op
        if hook is not None:
            hook(client_id, op, data or b"", acked)

    def save_session(self, record: SessionRecord) -> None:
        """Write the session row; replicate the record."""
        self.inner.save_session(record)
        self._op(record.client_id, OP_SESSION, None, True)

    def delete_session(self, client_id: str) -> None:
        """Delete the session; its replicas drop their copy."""
        self.inner.delete_session(client_id)
        self._op(client_id, OP_DROP)

    def save_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None:
        """Write one subscription; replicas get the record with its subscriptions (a resumed session must match
        the messages forwarded to it before its client subscribes again)."""
        self.inner.save_subscription(client_id, topic_filter, options)
        self._op(client_id, OP_SESSION, None, True)

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        """Delete one subscription; replicas get the record."""
        self.inner.delete_subscription(client_id, topic_filter)
        self._op(client_id, OP_SESSION, None, True)

    def enqueue(self, client_id: str, delivery: Delivery) -> None:
        """Write a queue row; replicate it synchronously (the next ack waits for the replicas)."""
        self.inner.enqueue(client_id, delivery)
        if self.on_enqueued is not None:
            self.on_enqueued(client_id, delivery)
        if delivery.state is DeliveryState.SENT and delivery.qos == 1:  # sent as it was queued (Session._send_now):
            delivery = replace(delivery, packet_id=None, state=DeliveryState.QUEUED)  # replicas hold QoS1 queued
        self._op(client_id, OP_ENQUEUE, encode_delivery(delivery), True)

    def update_delivery(self, client_id: str, seq: int, state: DeliveryState, packet_id: int | None) -> None:
        """Record a delivery's state; replicate the outbound QoS2 flow synchronously (a QoS1 SENT delivery resends as
        new after a failover, an allowed duplicate)."""
        self.inner.update_delivery(client_id, seq, state, packet_id)
        # QoS2: the PUBLISH goes out only once the replicas know its packet id (a resumed session resends it with
        # DUP under the same id [MQTT-4.3.3-?]); PUBREL only once they know it is RELEASED (never resent as new).
        if state == DeliveryState.RELEASED or (
                state == DeliveryState.SENT and self.is_qos2 is not None and self.is_qos2(client_id, packet_id)):
            self._op(client_id, OP_UPDATE, encode_update(seq, state, packet_id), True)

    def remove_delivery(self, client_id: str, seq: int) -> None:
        """Delete a queue row; the replicas release it too."""
        self.inner.remove_delivery(client_id, seq)
        self._op(client_id, OP_REMOVE, encode_uint(seq))

    def save_retained(self, message: Message) -> None:
        """Write a retained message (replicated by the retained space, not here)."""
        self.inner.save_retained(message)

    def delete_retained(self, topic: str) -> None:
        """Delete a retained message."""
        self.inner.delete_retained(topic)

    def save_incoming_qos2(self, client_id: str, packet_id: int, message: Message | None) -> None:
        """Hold an incoming QoS2 packet id; replicas hold it too (no duplicate after a failover)."""
        self.inner.save_incoming_qos2(client_id, packet_id, message)
        if self.on_qos2_added is not None:  # replicated with its message (the broker's qos2_received follows)
            self.on_qos2_added(client_id, packet_id)

    def delete_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        """Release an incoming QoS2 packet id."""
        self.inner.delete_incoming_qos2(client_id, packet_id)
        self._op(client_id, OP_QOS2_DEL, encode_uint(packet_id))

    def set_meta(self, key: str, value: str) -> None:
        """Node-level key/value."""
        self.inner.set_meta(key, value)

    def stats(self) -> dict[str, float]:
        """The SQLite store's figures plus callbacks waiting for peers."""
        out = self.inner.stats()
        out["cluster_gated"] = float(len(self._fifo))
        return out
