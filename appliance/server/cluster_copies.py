"""Replica side of queue replication: an owner's operations applied to our copies, durably, then acked."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from appliance.cluster.ownership import (
    OP_ENQUEUE,
    OP_ENQUEUE_MANY,
    OP_QOS2_ADD,
    OP_QOS2_DEL,
    OP_REMOVE,
    OP_REMOVE_MANY,
    OP_SESSION,
    OP_SNAPSHOT,
    OP_STRANDED_ADD,
    OP_STRANDED_DEL,
    OP_UPDATE,
    ReplicaCopy,
    apply_op,
    decode_qos2_add,
    decode_stranded_add,
    decode_text,
    decode_uint,
    decode_uints,
    decode_update,
    encode_copy,
)

from .cluster_sessions import seq_key

if TYPE_CHECKING:
    from collections.abc import Callable

    from appliance.cluster.wire import Replicate
    from appliance.store import SqliteStore


class ReplicaCopies:
    """Mixed into ClusterWiring: the replica copies of sessions owned by other nodes, kept on disk."""

    inner: SqliteStore
    copies: dict[str, ReplicaCopy]
    _rep_due: dict[str, int]  # peer -> last replica operation applied in this loop iteration
    events: Any
    clock: Callable[[], float]

    def _emit(self, kind: str, **fields: Any) -> None:
        """Delivery-log event (ClusterWiring)."""
        raise NotImplementedError

    def _replica_committed(self, peer: str, seq: int) -> None:
        """Ack a committed replica write (ClusterWiring)."""
        raise NotImplementedError

    # -- queue replication (replica side) ------------------------------------------------------------------------
    def _on_replicate(self, peer: str, rep: Replicate) -> None:
        """Apply one queue operation to our copy, durably, then ack it."""
        cid = rep.client_id
        old = self.copies.get(cid)
        old_owner, old_version = (old.owner, old.version) if old is not None else (None, -1)
        new = apply_op(old, peer, rep.op, rep.data)
        changed = new is not old or (new is not None and new.version != old_version)
        if changed and new is not None:
            new.touched = self.clock()
        if changed:
            self._persist_copy(cid, new, rep, whole=new is not old or old_owner != peer)
        due = self._rep_due  # one meta write and one commit callback per peer and loop iteration
        if not due:
            asyncio.get_running_loop().call_soon(self._flush_replica_commits)
        due[peer] = rep.seq
        if self.events is not None and changed and new is not None and rep.op in (OP_ENQUEUE, OP_ENQUEUE_MANY):
            for seq in new.added if rep.op == OP_ENQUEUE_MANY else [new.last] if new.last is not None else []:
                self._emit("replicated", message=new.delivery(seq).message, subscriber=cid, peer_node=peer)
        if rep.op == OP_SNAPSHOT and new is not None:
            self._emit("replicated", subscriber=cid, peer_node=peer, reason="snapshot")

    def _flush_replica_commits(self) -> None:
        """Operations applied this iteration: persist each peer's stream position; ack them all after the commit."""
        due, self._rep_due = self._rep_due, {}
        for peer, seq in due.items():
            self.inner.set_meta(f"cluster.rep.{peer}", str(seq))
            self.inner.after_commit(self._replica_committed, peer, seq)

    def _persist_copy(self, cid: str, copy: ReplicaCopy | None, rep: Replicate, whole: bool) -> None:
        """Write what one operation changed in a replica copy (header row, queue rows)."""
        inner = self.inner
        if copy is None:
            self.copies.pop(cid, None)
            inner.kv_delete("rs", cid)
            inner.kv_delete_ns(f"rq/{cid}")
            inner.kv_delete_ns(f"rx/{cid}")
            return
        self.copies[cid] = copy
        ns = f"rq/{cid}"
        if whole or rep.op in (OP_SESSION, OP_QOS2_ADD, OP_QOS2_DEL, OP_STRANDED_ADD):  # the mark is in the header
            header = ReplicaCopy(copy.owner, copy.epoch, copy.record, {}, copy.qos2, copy.version, mark=copy.mark)
            inner.kv_put("rs", cid, encode_copy(header))
        if whole:  # a publisher's pending / stranded messages: one row each (a restarted replica passes them on)
            inner.kv_delete_ns(f"rx/{cid}")
            for key, entry in copy.stranded.items():
                inner.kv_put(f"rx/{cid}", key, entry)
        elif rep.op == OP_QOS2_ADD:
            _pid, mark, entry = decode_qos2_add(rep.data)
            if entry:
                inner.kv_put(f"rx/{cid}", f"{mark:020d}/", entry)
        elif rep.op == OP_STRANDED_ADD:
            _mark, key, entry = decode_stranded_add(rep.data)
            inner.kv_put(f"rx/{cid}", key, entry)
        elif rep.op == OP_STRANDED_DEL:
            inner.kv_delete(f"rx/{cid}", decode_text(rep.data))
        if whole:
            inner.kv_delete_ns(ns)
            for seq in copy.queue:
                inner.kv_put(ns, seq_key(seq), copy.encoded(seq))
        elif rep.op == OP_ENQUEUE:
            if copy.last is not None:
                inner.kv_put(ns, seq_key(copy.last), rep.data)
        elif rep.op == OP_ENQUEUE_MANY:
            for seq in copy.added:
                inner.kv_put(ns, seq_key(seq), copy.encoded(seq))
        elif rep.op == OP_UPDATE:
            seq = decode_update(rep.data)[0]
            if seq in copy.queue:
                inner.kv_put(ns, seq_key(seq), copy.encoded(seq))
        elif rep.op == OP_REMOVE:
            inner.kv_delete(ns, seq_key(decode_uint(rep.data)))
        elif rep.op == OP_REMOVE_MANY:
            for seq in decode_uints(rep.data):
                inner.kv_delete(ns, seq_key(seq))
