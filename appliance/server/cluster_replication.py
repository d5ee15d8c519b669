"""Owner side of queue replication for the cluster wiring: placement, the owner -> replica operations (enqueues and
releases batched per session and loop iteration), re-replication after membership changes."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from typing import TYPE_CHECKING

from appliance.broker.handover import session_image
from appliance.cluster.forwarding import OnAcked, ReplicaSender
from appliance.cluster.membership import rendezvous
from appliance.cluster.ownership import (
    OP_DROP,
    OP_ENQUEUE,
    OP_ENQUEUE_MANY,
    OP_REMOVE,
    OP_REMOVE_MANY,
    OP_SESSION,
    OP_SNAPSHOT,
    SessionClaim,
    decode_uint,
    encode_raws,
    encode_snapshot,
    encode_uints,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService

    from .cluster_store import ClusterStore


class QueueReplication:
    """Mixed into ClusterWiring (first, so its methods win over the other mixins' declarations)."""

    node_id: str
    service: ClusterService | None
    broker: Broker | None
    store: ClusterStore
    r: int
    claims: dict[str, SessionClaim]
    assigned: dict[str, list[str]]
    _kept_copies: dict[str, list[str]]  # client id -> replicas whose copy stays until the taker confirms our hand-over
    clock: Callable[[], float]
    _seq_base: int
    _rebalance_pending: bool
    _rep_waiters: dict[str, OnAcked]
    _removes: dict[str, list[int]]
    _enqueues: dict[str, tuple[list[str], int, list[bytes]]]
    _batch_id: int
    _moving: dict[str, tuple[dict[str, int], list[str]]]  # session -> (new replica -> snapshot seq, copies kept)
    _seen: dict[str, OrderedDict[str, None]]  # SessionMigration: ids of the messages queued per local session
    snapshot_extras: Callable[[str], tuple[int, dict[str, bytes]]]  # IngressGuard: mark and pending messages

    @property
    def svc(self) -> ClusterService:
        """The running service (ClusterWiring)."""
        raise NotImplementedError

    def _live(self) -> list[str]:
        """Live members (ClusterWiring)."""
        raise NotImplementedError

    def _placement(self, cid: str) -> list[str]:
        """The R-1 replica nodes of a session owned here, from the live members."""
        others = [n for n in self._live() if n != self.node_id]
        return rendezvous(cid, others, self.r - 1)

    def _snapshot(self, cid: str) -> bytes:
        """OP_SNAPSHOT data of a local session: its state, pending messages, and the ids it remembers (a new replica
        learns what the session had before it, delivered ones included: chaos 30033, a resumed session took a stale
        pending message as new because its copy knew only what was queued since the snapshot)."""
        assert self.broker is not None
        image = session_image(self.broker, cid)
        assert image is not None
        mark, stranded = self.snapshot_extras(cid)
        return encode_snapshot(self._copy_epoch(cid), image[0], image[1], image[2], mark, stranded,
                               list(self._seen.get(cid, ())))

    def _copy_epoch(self, cid: str) -> float:
        """The epoch our replicas' copy of a local session carries: its claim's, or just above the claim it supersedes
        while ours is not written yet (taken over here). With that claim's own epoch, the old owner's late snapshot or
        record (resent after its isolation) replaced our copy at the replica, which then ignored our enqueues (chaos
        110009, 46 lost). Not the clock, which would beat any later claim's copies; a stale session still here after its
        claim moved on also beats the owner's copy of that claim, as the tie did before."""
        claim = self.claims.get(cid)
        if claim is None:
            return self.clock()
        return claim.epoch if claim.owner == self.node_id else math.nextafter(claim.epoch, math.inf)

    def _replicate(self, peer: str, cid: str, op: int, data: bytes, acked: bool, waiter: OnAcked | None = None) -> int:
        """Send one replica operation; return its stream seq. The session's batched enqueues go first."""
        if self._enqueues and op != OP_ENQUEUE_MANY and cid in self._enqueues:
            self._flush_enqueues_of(cid)
        svc = self.svc
        if peer not in svc.replica_senders:
            svc.replica_senders[peer] = ReplicaSender(peer, next_seq=self._seq_base)
        store = self.store
        if waiter is None:
            waiter = self._rep_waiters.get(peer)
        if waiter is None:
            waiter = self._rep_waiters[peer] = lambda seq, _st: store.wait_done(peer, seq, "r")

        rep = svc.replicate(peer, cid, op, data, waiter)
        if acked and svc.links.is_up(peer):
            store.add_wait(peer, rep.seq, "r")
        return rep.seq

    def _drop_kept_copies(self, cid: str) -> None:
        """Our hand-over of `cid` was confirmed (or superseded): the replicas kept their copy until now (a stand-in
        start resumes from it if we die with the hand-over unsent, chaos 100334); not if the session is ours again."""
        peers = self._kept_copies.pop(cid, [])
        if self.broker is not None and cid not in self.broker.sessions:
            for peer in peers:
                self._replicate(peer, cid, OP_DROP, b"", False)

    def _session_op(self, cid: str, op: int, data: bytes, acked: bool) -> None:
        """A write to a session's durable state: the same write to its replicas (releases go as one operation per
        session and loop iteration, ahead of the session's next other operation)."""
        broker = self.broker
        if broker is None or self.service is None or self.r < 2:
            return
        removes = self._removes
        if op == OP_REMOVE:
            if not removes:
                asyncio.get_running_loop().call_soon(self._flush_removes)
            removes.setdefault(cid, []).append(decode_uint(data))
            return
        if removes and cid in removes:
            self._replicate_removes(cid, removes.pop(cid))
        if op == OP_DROP:
            self._moving.pop(cid, None)
            replicas = self.assigned.pop(cid, [])
            if cid in self._kept_copies:  # handed over: kept until the taker confirms it (_drop_kept_copies)
                self._kept_copies[cid] += [p for p in replicas if p not in self._kept_copies[cid]]
                return
            for peer in replicas:
                self._replicate(peer, cid, OP_DROP, b"", False)
            return
        session = broker.sessions.get(cid)
        if session is None or not session.persistent:
            return
        peers = self.assigned.get(cid)
        if peers is None:
            peers = self.assigned[cid] = self._placement(cid)
            snapshot = self._snapshot(cid)
            for peer in peers:
                self._replicate(peer, cid, OP_SNAPSHOT, snapshot, True)
            if op == OP_SESSION:
                return
        if op == OP_SESSION:
            data = encode_snapshot(self._copy_epoch(cid), session.record, [], [])
        elif op == OP_ENQUEUE and peers:
            self._batch_enqueue(cid, peers, data, acked)
            return
        for peer in peers:
            self._replicate(peer, cid, op, data, acked)

    def _batch_enqueue(self, cid: str, peers: list[str], data: bytes, acked: bool) -> None:
        """A session's enqueues of one loop iteration go to its replicas as one operation (one wait per replica,
        shared by every ack that needs them); any other write of the session sends them first."""
        batches = self._enqueues
        batch = batches.get(cid)
        if batch is None:
            if not batches:
                asyncio.get_running_loop().call_soon(self._flush_enqueues)
            self._batch_id += 1
            batch = batches[cid] = (list(peers), self._batch_id, [])
        batch[2].append(data)
        if acked:
            links = self.svc.links
            for peer in batch[0]:
                if links.is_up(peer):
                    self.store.add_wait(peer, batch[1], "b")

    def _flush_enqueues(self) -> None:
        for cid in list(self._enqueues):
            self._flush_enqueues_of(cid)

    def _flush_enqueues_of(self, cid: str) -> None:
        peers, batch_id, items = self._enqueues.pop(cid)
        data = encode_raws(items)
        for peer in peers:
            self._replicate(peer, cid, OP_ENQUEUE_MANY, data, False, self._batch_waiter(peer, batch_id))

    def _batch_waiter(self, peer: str, batch_id: int) -> OnAcked:
        store = self.store
        return lambda _seq, _status: store.wait_done(peer, batch_id, "b")

    def _flush_removes(self) -> None:
        removes, self._removes = self._removes, {}
        for cid, seqs in removes.items():
            self._replicate_removes(cid, seqs)

    def _replicate_removes(self, cid: str, seqs: list[int]) -> None:
        self._session_op(cid, OP_REMOVE_MANY, encode_uints(seqs), False)

    def _schedule_rebalance(self) -> None:
        if not self._rebalance_pending:
            self._rebalance_pending = True
            asyncio.get_running_loop().call_later(0.2, self._rebalance)

    def _rebalance(self) -> None:
        """Restore R copies of every persistent session owned here after a membership change (snapshots)."""
        self._rebalance_pending = False
        broker = self.broker
        if broker is None or self.r < 2:
            return
        for cid, session in list(broker.sessions.items()):
            if session.persistent:
                self._replace(cid)

    def _replace(self, cid: str, sent: list[tuple[str, int]] | None = None) -> list[str]:
        """Move one local session's replicas to its current placement (snapshots to new ones, OP_DROP to the ones
        it leaves, sent to a node that is down once its link is back); return them. A copy it leaves on a live node
        stays fed and is dropped only once every new replica holds its snapshot (chaos 40041: placement moved back
        to a node whose link had just returned; the old copy was dropped at once, the snapshot never arrived (the
        owner was isolated 0.1 s later) and the session resumed on the majority side found no copy: a fresh one).
        `sent` collects the (replica, seq) of the snapshots."""
        want = self._placement(cid)
        have = self.assigned.get(cid, [])
        if not want and have:  # no live node to move to: the copies stay until a new replica holds the session
            return have
        pending, _kept = self._moving.pop(cid, ({}, []))
        pending = {peer: seq for peer, seq in pending.items() if peer in want}
        if want != have:
            new = [peer for peer in want if peer not in have]
            if new:
                snapshot = self._snapshot(cid)
                for peer in new:
                    pending[peer] = self._replicate(peer, cid, OP_SNAPSHOT, snapshot, False,
                                                    self._snapshot_waiter(cid, peer))
                    if sent is not None:
                        sent.append((peer, pending[peer]))
            # Kept until the new replicas hold the snapshot, a down one too (its stream is resent at link-up): an
            # OP_DROP queued for it at once left no copy when it came back first (chaos 100459: pub2 fresh).
            kept = [peer for peer in have if peer not in want] if pending else []
            for peer in have:
                if peer not in want and peer not in kept:  # a copy left behind keeps pending messages released
                    self._replicate(peer, cid, OP_DROP, b"", False)  # later (chaos 30033)
            if kept:
                self._moving[cid] = (pending, kept)
            self.assigned[cid] = want + kept
        return want

    def _snapshot_waiter(self, cid: str, peer: str) -> OnAcked:
        store = self.store

        def acked(seq: int, status: int) -> None:
            store.wait_done(peer, seq, "r")
            self._snapshot_held(cid, peer, seq, status)
        return acked

    def _snapshot_held(self, cid: str, peer: str, seq: int, status: int) -> None:
        """A new replica acknowledged its snapshot: once all have, the live copies placement left are dropped."""
        move = self._moving.get(cid)
        if status or move is None or move[0].get(peer) != seq:
            return
        pending, kept = move
        del pending[peer]
        if pending:
            return
        del self._moving[cid]
        want = self._placement(cid)
        leaving = [p for p in kept if p not in want and p in self.assigned.get(cid, [])]
        for p in leaving:
            self._replicate(p, cid, OP_DROP, b"", False)
        self.assigned[cid] = [p for p in self.assigned.get(cid, []) if p not in leaving]
