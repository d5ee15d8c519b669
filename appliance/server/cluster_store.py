"""The broker's Store on a cluster node: SQLite underneath; after_commit also waits for peer acks; queue replication.

Every write goes to the SqliteStore in call order. Writes to a persistent session owned here are also sent to its
replicas (`on_session_op`). A forward or replica write that must be acknowledged registers a wait; the next
after_commit callback (a PUBACK, a SUBACK, a forward's ack...) runs only when the local commit and every wait
registered before it are done, in FIFO order (AckGate per callback). So an ack means: on disk here and on the peers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.broker.ports import Snapshot
from appliance.cluster.forwarding import AckGate
from appliance.cluster.ownership import (
    OP_DROP,
    OP_ENQUEUE,
    OP_QOS2_ADD,
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


class _Gated:
    """One after_commit callback waiting for its gate."""

    __slots__ = ("args", "callback", "gate", "ordered", "pending", "ran")

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], waits: dict[str, int],
                 ordered: bool) -> None:
        self.callback = callback
        self.args = args
        self.pending = waits  # peer -> acks still outstanding
        self.ordered = ordered  # client acks keep FIFO order; cluster-internal acks run as soon as they are due
        self.ran = False
        self.gate = AckGate(waits, _nothing)


def _nothing(_ok: bool) -> None:
    """AckGate's on_done: the FIFO checks gate.finished itself."""


class ClusterStore:
    """A Store (appliance.broker.ports) for a cluster node."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.on_session_op: SessionOp | None = None
        self._waits: dict[str, int] = {}  # peer -> waits registered since the last after_commit
        self._fifo: deque[_Gated] = deque()
        self._by_wait: dict[tuple[str, int, str], _Gated | None] = {}  # (peer, seq, kind) -> its gate, once bound
        self._unbound: list[tuple[str, int, str]] = []  # waits registered since the last after_commit

    # -- waits ---------------------------------------------------------------------------------------------------
    def add_wait(self, peer: str, seq: int, kind: str) -> None:
        """The next after_commit waits for (peer, seq) of stream `kind` to be acknowledged."""
        self._waits[peer] = self._waits.get(peer, 0) + 1
        self._by_wait[(peer, seq, kind)] = None
        self._unbound.append((peer, seq, kind))

    def wait_done(self, peer: str, seq: int, kind: str) -> None:
        """A stream ack covered (peer, seq)."""
        if (peer, seq, kind) not in self._by_wait:
            return
        entry = self._by_wait.pop((peer, seq, kind))
        if entry is None:  # acked before any after_commit bound it
            self._unbound.remove((peer, seq, kind))
            left = self._waits.get(peer, 0) - 1
            if left > 0:
                self._waits[peer] = left
            else:
                self._waits.pop(peer, None)
            return
        left = entry.pending.get(peer, 0) - 1
        entry.pending[peer] = left
        if left <= 0:
            entry.gate.peer_acked(peer)
            self._drain(entry)

    def peer_down(self, peer: str, kind: str) -> None:
        """Policy accepts the loss of `peer`: its waits of stream `kind` count as done (the data stays buffered)."""
        for key in [k for k in self._by_wait if k[0] == peer and k[2] == kind]:
            entry = self._by_wait.pop(key)
            if entry is None:
                self._unbound.remove(key)
                left = self._waits.get(peer, 0) - 1
                if left > 0:
                    self._waits[peer] = left
                else:
                    self._waits.pop(peer, None)
            else:
                left = entry.pending.get(peer, 0) - 1
                entry.pending[peer] = left
                if left <= 0:
                    entry.gate.peer_unreachable(peer, True)
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
        if not self._waits and not self._fifo:
            self.inner.after_commit(callback, *args)
            return
        self._gate(callback, args, True)

    def after_own_acks(self, callback: Callable[..., Any], *args: Any) -> None:
        """Like after_commit for cluster-internal acks: waits for the local commit and the waits registered since
        the last after_commit, but not behind client acks (that would let two nodes wait on each other)."""
        if not self._waits:
            self.inner.after_commit(callback, *args)
            return
        self._gate(callback, args, False)

    def _gate(self, callback: Callable[..., Any], args: tuple[Any, ...], ordered: bool) -> None:
        entry = _Gated(callback, args, self._waits, ordered)
        for key in self._unbound:
            self._by_wait[key] = entry
        self._unbound = []
        self._waits = {}
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
        """Write one subscription (the record op carries it to replicas)."""
        self.inner.save_subscription(client_id, topic_filter, options)

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        """Delete one subscription."""
        self.inner.delete_subscription(client_id, topic_filter)

    def enqueue(self, client_id: str, delivery: Delivery) -> None:
        """Write a queue row; replicate it synchronously (the next ack waits for the replicas)."""
        self.inner.enqueue(client_id, delivery)
        self._op(client_id, OP_ENQUEUE, encode_delivery(delivery), True)

    def update_delivery(self, client_id: str, seq: int, state: DeliveryState, packet_id: int | None) -> None:
        """Record a delivery's state; replicate QoS2 releases (a SENT delivery resends as queued after failover)."""
        self.inner.update_delivery(client_id, seq, state, packet_id)
        if state == DeliveryState.RELEASED:  # QoS2 past PUBREC: a replica must not send the PUBLISH again
            self._op(client_id, OP_UPDATE, encode_update(seq, state, packet_id))

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
        self._op(client_id, OP_QOS2_ADD, encode_uint(packet_id), True)

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
