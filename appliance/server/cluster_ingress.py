"""Publisher-side guarantees across a node's death: QoS2 ingress exactly once, and per-publisher order for messages
acknowledged while their target node was unreachable (issue 4).

QoS2: each incoming packet id of a replicated publisher session carries an ingress mark (a per-node counter that
grows across restarts) to the session's replicas. Until they acknowledge it, nothing the message caused leaves for
any other node (the node's Forward / Replicate streams to them are held), and the message is tagged durably
(`q2u`). A node restarted with tags holds all its streams until it has learnt the current claims, then keeps the
forwards and queued copies of a tagged message only where the publisher's session continues its state and that
state knew the packet id (`ownership.keeps_forward`); elsewhere the publisher's resend is routed as new, so the
restarted node's copies go.

Stranded: a message forwarded while its target node is unreachable (or in flight when the target went down) is
also written to the publisher session's replicas (OP_STRANDED_ADD, before the PUBACK) until the target acknowledges
it. A session resumed from such a copy passes those messages on before anything newer of the publisher; the
restarted old owner drops its own copies of them (`str` tags).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from appliance.broker.model import Message
from appliance.cluster.ownership import (
    OP_QOS2_ADD,
    OP_SESSION,
    OP_SNAPSHOT,
    OP_STRANDED_ADD,
    OP_STRANDED_DEL,
    ReplicaCopy,
    SessionClaim,
    decode_uint,
    encode_mark_op,
    keeps_forward,
)
from appliance.cluster.wire import Forward, _Reader, _Writer, decode_body, encode

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService
    from appliance.store import SqliteStore

    from .cluster_store import ClusterStore

log = logging.getLogger("appliance.cluster")
Q2_TAGS, STRANDED_TAGS = "q2u", "str"


def _pair(a: str, b: str) -> bytes:
    w = _Writer()
    w.text(a)
    w.text(b)
    return bytes(w.out)


def _unpair(data: bytes) -> tuple[str, str]:
    r = _Reader(data)
    return r.text(), r.text()


class IngressGuard:
    """Mixed into ClusterWiring: ingress marks, the QoS2 barrier, stranded messages and restart reconciliation."""

    node_id: str
    c: dict[str, Any]
    broker: Broker | None
    inner: SqliteStore
    store: ClusterStore
    claims: dict[str, SessionClaim]
    assigned: dict[str, list[str]]
    r: int

    @property
    def svc(self) -> ClusterService:
        """The running service (ClusterWiring)."""
        raise NotImplementedError

    def _session_op(self, cid: str, op: int, data: bytes, acked: bool) -> None:
        """Replicate one operation of a local session (ClusterWiring)."""
        raise NotImplementedError

    def _deliver_here(self, message: Message, clients: tuple[str, ...]) -> list[str]:
        """Deliver a forwarded message to local sessions that lack it (ClusterWiring)."""
        raise NotImplementedError

    def _onward(self, message: Message, clients: list[str]) -> None:
        """Forward a message to the owners of clients not here (ClusterWiring)."""
        raise NotImplementedError

    def _init_ingress(self) -> None:
        self._mark = int(time.time() * 1_000_000)  # grows across restarts, like stream seqs
        self._q2_last: dict[str, int] = {}  # publisher -> mark of the packet id it just stored (for route_remote)
        self._unconfirmed: dict[int, list[Any]] = {}  # mark -> [publisher, msg id, replicas left, (peer, hold)s]
        self._stranded: dict[str, dict[str, bytes]] = {}  # publisher -> key -> encoded Forward
        self._strand_keys: dict[tuple[str, int], tuple[str, str]] = {}  # (node, fwd seq) -> (publisher, key)
        self._restored_q2: dict[str, tuple[str, str]] = {}  # tag key -> (publisher, msg id)
        self._restored_str: dict[str, tuple[str, str]] = {}  # tag key -> (publisher, stranded key)
        self._reconciled: asyncio.Event | None = None

    def next_mark(self) -> int:
        """The next ingress mark of this node."""
        self._mark = max(self._mark + 1, int(time.time() * 1_000_000))
        return self._mark

    # -- QoS2 ingress ---------------------------------------------------------------------------------------------
    def _qos2_added(self, cid: str, data: bytes, peers: list[str]) -> bytes:
        """A publisher's packet id goes to its replicas with a mark; hold every other peer's stream until they
        acknowledge it (a message is never seen elsewhere before the publisher's replicas know its packet id)."""
        mark = self.next_mark()
        self._q2_last[cid] = mark
        links = self.svc.links
        waiting = {p for p in peers if links.is_up(p)}  # a replica down now gets the id with its next snapshot
        if waiting:
            svc = self.svc
            held = [(p, svc.hold(p)) for p in svc.membership.all() if p != self.node_id and p not in peers]
            self._unconfirmed[mark] = [cid, None, waiting, held]
        return encode_mark_op(mark, packet_id=decode_uint(data))

    def _qos2_acked(self, mark: int, peer: str) -> None:
        """A replica acknowledged (or lost) the packet id of `mark`; the last one confirms it."""
        entry = self._unconfirmed.get(mark)
        if entry is None:
            return
        entry[2].discard(peer)
        if entry[2]:
            return
        del self._unconfirmed[mark]
        if entry[1] is not None:
            self.inner.kv_delete(Q2_TAGS, f"{mark:020d}")
        for held, token in entry[3]:
            self.svc.release(held, token)

    def _tag_routed(self, message: Message) -> None:
        """route_remote: a QoS2 message whose packet id is not yet confirmed is tagged durably (same commit)."""
        mark = self._q2_last.pop(message.publisher, None) if message.qos == 2 else None
        entry = self._unconfirmed.get(mark) if mark is not None else None
        if entry is not None and mark is not None:
            entry[1] = message.msg_id
            self.inner.kv_put(Q2_TAGS, f"{mark:020d}", _pair(message.publisher, message.msg_id))

    def _ingress_peer_down(self, peer: str) -> None:
        """A replica that had not acknowledged a packet id is gone: the session is re-replicated at once to its new
        replicas (a snapshot, which carries the id) and the barrier waits for them instead; their streams are
        released, the snapshot going out ahead of the held forwards."""
        for mark, entry in list(self._unconfirmed.items()):
            if peer not in entry[2]:
                continue
            entry[2].discard(peer)
            if entry[2]:
                continue
            cid = entry[0]
            links = self.svc.links
            new = [p for p in self._placement(cid) if links.is_up(p)]
            if not new or self.broker is None or cid not in self.broker.sessions:
                self._qos2_acked(mark, peer)  # nothing left to resume from: the barrier has no purpose
                continue
            self.assigned[cid] = new
            entry[2].update(new)
            for held, token in [h for h in entry[3] if h[0] in new]:
                entry[3].remove((held, token))
                self.svc.release(held, token)
            snapshot = self._snapshot(cid)
            for replica in new:
                self._replicate(replica, cid, OP_SNAPSHOT, snapshot, False, mark)

    def _placement(self, cid: str) -> list[str]:
        """The replica nodes of a local session (ClusterWiring)."""
        raise NotImplementedError

    def _snapshot(self, cid: str) -> bytes:
        """OP_SNAPSHOT data of a local session (ClusterWiring)."""
        raise NotImplementedError

    # -- stranded messages ---------------------------------------------------------------------------------------
    def _strand(self, node: str, fwd: Forward, frame: bytes | None = None) -> list[tuple[str, int]]:
        """A QoS>0 forward to an unreachable node: write it to its publisher session's replicas; return the
        (replica, replicate seq) writes made (the caller decides what waits for them)."""
        pub = fwd.message.publisher
        session = self.broker.sessions.get(pub) if self.broker is not None else None
        if (self.r < 2 or session is None or not session.persistent or (node, fwd.seq) in self._strand_keys
                or not fwd.message.qos):
            return []
        if pub not in self.assigned:
            self._session_op(pub, OP_SESSION, b"", False)  # placement and a first snapshot
        peers = [p for p in self.assigned.get(pub, []) if self.svc.links.is_up(p)]
        if not peers:
            return []
        mark = self.next_mark()
        key = f"{mark:020d}/{node}"
        entry = frame if frame is not None else encode(fwd)
        self._stranded.setdefault(pub, {})[key] = entry
        self._strand_keys[(node, fwd.seq)] = (pub, key)
        self.inner.kv_put(STRANDED_TAGS, f"{node}/{fwd.seq:020d}", _pair(pub, key))
        data = encode_mark_op(mark, key, entry)
        return [(peer, self._replicate(peer, pub, OP_STRANDED_ADD, data, False)) for peer in peers]

    def _unstrand(self, node: str, seq: int) -> None:
        """The target acknowledged a stranded forward (or it left this stream): the replicas let it go."""
        found = self._strand_keys.pop((node, seq), None)
        if found is None:
            return
        pub, key = found
        self.inner.kv_delete(STRANDED_TAGS, f"{node}/{seq:020d}")
        entries = self._stranded.get(pub)
        if entries is not None:
            entries.pop(key, None)
            if not entries:
                del self._stranded[pub]
        if self.broker is not None and pub in self.broker.sessions:
            w = _Writer()
            w.text(key)
            self._session_op(pub, OP_STRANDED_DEL, bytes(w.out), False)

    def _strand_in_flight(self, peer: str) -> None:
        """`peer` went down with forwards in flight: strand them; a client ack waiting for the peer's ack now waits
        for the publisher's replicas instead (the allow_publish policy then releases the peer's waits)."""
        sender = self.svc.senders.get(peer)
        if sender is None:
            return
        for fwd in sender.resend():
            for replica, rep_seq in self._strand(peer, fwd):
                self.store.chain_wait((peer, fwd.seq, "f"), (replica, rep_seq, "r"))

    def _replicate(self, peer: str, cid: str, op: int, data: bytes, acked: bool, mark: int = 0) -> int:
        """Send one replica operation (ClusterWiring)."""
        raise NotImplementedError

    def snapshot_extras(self, cid: str) -> tuple[int, dict[str, bytes]]:
        """What a snapshot of a local session carries besides its state: the current mark, its stranded messages."""
        return self._mark, dict(self._stranded.get(cid, {}))

    def pass_on_stranded(self, copy: ReplicaCopy) -> int:
        """A session resumed from `copy`: what its owner acknowledged while the targets were unreachable goes on
        now, in the order it was acknowledged, before anything newer of the publisher; return how many."""
        for key in sorted(copy.stranded):
            frame = copy.stranded[key]
            fwd = decode_body(frame[4], frame[5:])
            if isinstance(fwd, Forward):
                self._onward(fwd.message, self._deliver_here(fwd.message, fwd.clients))
        return len(copy.stranded)

    # -- restart ---------------------------------------------------------------------------------------------------
    def restore_ingress(self, kv: dict[str, dict[str, bytes]]) -> None:
        """Tags left by the previous run: hold every stream until they are reconciled with the claims."""
        self._restored_q2 = {k: _unpair(v) for k, v in kv.get(Q2_TAGS, {}).items()}
        self._restored_str = {k: _unpair(v) for k, v in kv.get(STRANDED_TAGS, {}).items()}
        for tag, (pub, key) in self._restored_str.items():
            node, seq = tag.rsplit("/", 1)
            self._strand_keys[(node, int(seq))] = (pub, key)
        if self._restored_q2 or self._restored_str:
            self.svc.hold_all()
            self._reconciled = asyncio.Event()

    async def async_reconcile(self) -> None:
        """After the restart: once a peer is up and the claims exchanged, reconcile (bounded wait)."""
        if self._reconciled is None or self._reconciled.is_set():
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.c["failure_timeout"]
        while loop.time() < deadline and not self.svc.links.up_peers():
            await asyncio.sleep(0.05)
        if self.svc.links.up_peers():
            await asyncio.sleep(min(1.0, self.c["failure_timeout"]))  # digests answered, repairs applied
        if not self._reconciled.is_set():
            self._reconcile()

    def _reconcile(self) -> None:
        """Drop the forwards and queued copies that the publisher's current session makes redundant."""
        assert self._reconciled is not None
        drop_ids: set[str] = set()
        for tag, (pub, msg_id) in self._restored_q2.items():
            if not keeps_forward(self.claims.get(pub), self.node_id, int(tag), False):
                drop_ids.add(msg_id)
            self.inner.kv_delete(Q2_TAGS, tag)
        drop_fwd: set[tuple[str, int]] = set()
        for tag, (pub, key) in self._restored_str.items():
            node, seq = tag.rsplit("/", 1)
            mark = int(key.split("/", 1)[0])
            local = self.broker is not None and pub in self.broker.sessions
            if not keeps_forward(self.claims.get(pub), self.node_id, mark, True):
                drop_fwd.add((node, int(seq)))
            elif local:
                self._stranded.setdefault(pub, {})[key] = b""  # filled below from the buffer
                continue
            self._strand_keys.pop((node, int(seq)), None)
            self.inner.kv_delete(STRANDED_TAGS, tag)
        dropped = 0
        for node, sender in self.svc.senders.items():
            for fwd in sender.resend():
                found = self._strand_keys.get((node, fwd.seq))
                if found is not None and self._stranded.get(found[0], {}).get(found[1]) == b"":
                    self._stranded[found[0]][found[1]] = encode(fwd)
                if fwd.message.msg_id in drop_ids or (node, fwd.seq) in drop_fwd:
                    for _msg, waiters in sender.retarget([fwd.seq]):
                        for waiter in waiters:
                            self.inner.after_commit(waiter, fwd.seq, 0)
                    self.inner.kv_delete(f"fwd/{node}", f"{fwd.seq:020d}")
                    dropped += 1
        for pub in list(self._stranded):
            self._stranded[pub] = {k: v for k, v in self._stranded[pub].items() if v}
            if not self._stranded[pub]:
                del self._stranded[pub]
        purged = self._purge_local(drop_ids)
        self._restored_q2, self._restored_str = {}, {}
        self._reconciled.set()
        self.svc.release_all()
        log.info("restart reconciled: %d forwards and %d queued copies dropped (their publishers' sessions moved)",
                 dropped, purged)

    def _purge_local(self, drop_ids: set[str]) -> int:
        """Queued copies of dropped QoS2 messages in local sessions (never sent: delivery waited for the barrier)."""
        broker = self.broker
        if broker is None or not drop_ids:
            return 0
        purged = 0
        for cid, session in broker.sessions.items():
            doomed = [d for d in [*session.queue, *session.inflight.values()] if d.message.msg_id in drop_ids]
            for delivery in doomed:
                if delivery in session.queue:
                    session.queue.remove(delivery)
                elif delivery.packet_id is not None:
                    session.inflight.pop(delivery.packet_id, None)
                if session.store is not None:
                    self.store.remove_delivery(cid, delivery.seq)
                purged += 1
        return purged


__all__ = ["OP_QOS2_ADD", "IngressGuard"]
