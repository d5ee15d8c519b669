"""Publisher-side guarantees across a node's death: QoS2 ingress exactly once, and per-publisher order for messages
acknowledged while their target node was unreachable (issue 4).

Both rest on the publisher session's replicas holding, besides the session, the messages of that publisher whose
routing is not yet known to be complete ("pending", keyed by an ingress mark, a per-node counter that grows across
restarts):
- a QoS2 message, from its PUBLISH (the packet id and the message in one operation, before the PUBREC) until
  everything it caused is acknowledged (then the PUBREC goes out and the entry is released);
- a message forwarded while its target node was unreachable (or in flight when it went down), from then (before
  the PUBACK) until that node acknowledges it.
A session resumed from such a copy passes its pending messages on, in mark order, before anything newer of the
publisher (receivers drop a copy they already had: same message id). The node that owned it keeps durable tags
(`q2u`, `str`) of what it has pending; restarted, it holds all its streams until it has learnt the current claims,
then drops its own forwards and queued copies of the messages that a session resumed from its copy has taken over
(`ownership.keeps_forward`): they arrive once, in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appliance.broker.model import Message
from appliance.cluster.forwarding import OnAcked
from appliance.cluster.ownership import (
    OP_DROP,
    OP_QOS2_ADD,
    OP_SESSION,
    OP_SNAPSHOT,
    OP_STRANDED_ADD,
    OP_STRANDED_DEL,
    ReplicaCopy,
    SessionClaim,
    decode_text_pair,
    encode_mark_op,
    encode_texts,
    keeps_forward,
)
from appliance.cluster.wire import Forward, decode_body, encode
from appliance.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService
    from appliance.store import SqliteStore

    from .cluster_store import ClusterStore, Wait

log = logging.getLogger("appliance.cluster")
Q2_TAGS, STRANDED_TAGS = "q2u", "str"


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
    _reconcile_handing: Callable[[set[str]], int]  # HandoverAnswers: the same drop in unconfirmed hand-overs

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

    def _targets(self, message: Message) -> dict[str, list[str]]:
        """Remote node -> its sessions matching a message (ClusterWiring)."""
        raise NotImplementedError

    def _forward(self, node: str, message: Message, clients: tuple[str, ...]) -> list[Wait]:
        """Durably buffer and send one Forward; the waits it registered (ClusterWiring)."""
        raise NotImplementedError

    def _init_ingress(self) -> None:
        self._mark = int(time.time() * 1_000_000)  # grows across restarts, like stream seqs
        # publisher -> [(packet id, forward holds, replica holds)] until qos2_received (or the flush) takes them
        self._q2_stash: dict[str, list[tuple[int, list[tuple[str, int]], list[tuple[str, int]]]]] = {}
        self._unconfirmed: dict[int, list[Any]] = {}  # mark -> [publisher, replicas left, holds (peer, token)]
        self._q2_settle: tuple[str, str] | None = None  # (publisher, pending key) of the QoS2 message being routed
        self._stranded: dict[str, dict[str, bytes]] = {}  # publisher -> pending key -> encoded Forward
        self._strand_keys: dict[tuple[str, int], tuple[str, str]] = {}  # (node, fwd seq) -> (publisher, key)
        self._restored_q2: dict[str, tuple[str, str]] = {}  # tag key -> (publisher, msg id)
        self._restored_str: dict[str, tuple[str, str]] = {}  # tag key -> (publisher, stranded key)
        self._reconciled: asyncio.Event | None = None
        self._held_down: set[str] = set()  # peers gone while on a minority side: their acks wait (chaos 30625)

    def next_mark(self) -> int:
        """The next ingress mark of this node."""
        self._mark = max(self._mark + 1, int(time.time() * 1_000_000))
        return self._mark

    # -- QoS2 ingress ---------------------------------------------------------------------------------------------
    def _replicated(self, cid: str) -> list[str]:
        """The replicas of a local persistent session (placed now if it has none yet); [] when not replicated."""
        session = self.broker.sessions.get(cid) if self.broker is not None else None
        if self.r < 2 or session is None or not session.persistent:
            return []
        if cid not in self.assigned:
            self._session_op(cid, OP_SESSION, b"", False)  # placement and a first snapshot
        elif len(self.assigned[cid]) < self.r - 1:  # under-replicated (a peer just returned): place it now
            return self._replace(cid)
        return self.assigned.get(cid, [])

    def _replace(self, cid: str, sent: list[tuple[str, int]] | None = None) -> list[str]:
        """Move a local session's replicas to its current placement (ClusterWiring)."""
        raise NotImplementedError

    def _qos2_added(self, cid: str, pid: int) -> None:
        """ClusterStore hook, a publisher's packet id is being stored: from now until its replicas acknowledge it
        (with its message, sent by qos2_received, which follows at once, before the local routing), no forward and
        no replica operation leaves for any other peer (a local subscriber's enqueue and SENT state went out to its
        replica unheld, chaos 43042); a left-over (adoption) goes alone at the end of the iteration."""
        peers = self._replicated(cid)
        links = self.svc.links
        holds: list[tuple[str, int]] = []
        replica_holds: list[tuple[str, int]] = []
        if any(links.is_up(p) for p in peers):
            svc = self.svc
            others = [p for p in svc.membership.all() if p != self.node_id and p not in peers]
            holds = [(p, svc.hold(p)) for p in others]
            replica_holds = [(p, svc.hold_replicas(p)) for p in others]
        if not self._q2_stash:
            asyncio.get_running_loop().call_soon(self._flush_q2_stash)
        self._q2_stash.setdefault(cid, []).append((pid, holds, replica_holds))  # an adoption stores several at once

    def _flush_q2_stash(self) -> None:
        """Packet ids no qos2_received took (an adopted session's): their replica holds are placed again after the id
        operation (held from the store call until now, they could wait for an id submitted after them)."""
        stash, self._q2_stash = self._q2_stash, {}
        svc = self.svc
        for cid, items in stash.items():
            for pid, holds, replica_holds in items:
                for peer, token in replica_holds:
                    svc.release(peer, token)
                self._send_qos2(cid, self.next_mark(), encode_mark_op(self._mark, packet_id=pid), holds, True)

    def _send_qos2(self, cid: str, mark: int, data: bytes, holds: list[tuple[str, int]],
                   hold_replicas: bool = False) -> None:
        """OP_QOS2_ADD to the session's replicas; the holds end once every reachable one acknowledged it (or, at
        the latest, after failure_timeout: a replica that slow is about to be declared down anyway). With
        `hold_replicas`, the replica streams to the other peers are held from just after the id went out."""
        svc = self.svc
        replicas = self.assigned.get(cid, [])
        peers = [p for p in replicas if svc.links.is_up(p)]
        self._unconfirmed[mark] = [cid, set(peers), holds]
        for peer in replicas:
            self._replicate(peer, cid, OP_QOS2_ADD, data, True, self._q2_waiter(peer, mark))
        if peers and hold_replicas:
            # Local subscribers' replicas elsewhere wait too: one that learnt the message (the owner killed before
            # the publisher's replicas had the id) resumed a session with it while the publisher's resend was routed
            # as new (chaos 41004, a QoS2 duplicate). A hold covers only operations submitted after it and is placed
            # after the id it waits for, or just before it (_qos2_added, for a PUBLISH: qos2_received follows the
            # store call at once): an id operation waits only for holds whose ids went out before it, so holds never
            # wait for each other in a cycle.
            others = [p for p in svc.membership.all() if p != self.node_id and p not in replicas]
            holds += [(p, svc.hold_replicas(p)) for p in others]
        if holds:
            asyncio.get_running_loop().call_later(self.c["failure_timeout"], self._q2_expire, mark)
        if not peers:
            self._q2_acked(mark, "")

    def _q2_waiter(self, peer: str, mark: int) -> OnAcked:
        store = self.store

        def acked(seq: int, _status: int) -> None:
            store.wait_done(peer, seq, "r")
            self._q2_acked(mark, peer)

        return acked

    def _q2_expire(self, mark: int) -> None:
        entry = self._unconfirmed.get(mark)
        if entry is None:
            return
        later = self._until_silent_down(entry[1])
        if later is not None:
            # A replica that has gone silent (cut off, frozen) is about to be declared down: then the session is
            # re-replicated and the holds wait for the new replicas (_ingress_peer_down). Released now, the message
            # would reach subscribers while no reachable replica holds its packet id (chaos 30507's logs: this
            # expiry came 22 ms before the link's; killed then, the publisher's resend is routed as new).
            asyncio.get_running_loop().call_later(later, self._q2_expire, mark)
            return
        log.warning("QoS2 packet id of %s not acknowledged by %s within failure_timeout: forwards released",
                    entry[0], sorted(entry[1]))
        entry[1].clear()
        self._q2_acked(mark, "")

    def _until_silent_down(self, peers: set[str]) -> float | None:
        """Seconds until the links of those peers that sent nothing for two heartbeats would time out (plus one
        heartbeat), or one heartbeat for a link that is closing (expired, its down not reported yet: then the
        session is re-replicated); None when every one of them was heard from lately (alive, only slow to commit)."""
        beat, timeout = self.c["heartbeat_interval"], self.c["failure_timeout"]
        live, waits = self.svc.membership.live(), []
        for row in self.svc.links.status():
            if row.peer_id not in peers:
                continue
            if row.state != "up":
                if row.peer_id in live:  # closing, its down report due (chaos 110766's logs: released 17 ms before)
                    waits.append(beat)
            elif row.last_seen is not None and row.last_seen > 2 * beat:
                waits.append(timeout - row.last_seen + beat)
        return max(waits) if waits else None

    def _q2_acked(self, mark: int, peer: str) -> None:
        """A replica acknowledged (or lost) a packet id; once all have, the streams it held go out."""
        entry = self._unconfirmed.get(mark)
        if entry is None:
            return
        entry[1].discard(peer)
        if entry[1]:
            return
        del self._unconfirmed[mark]
        for held, token in entry[2]:
            self.svc.release(held, token)

    def qos2_received(self, message: Message) -> None:
        """ClusterPort, a client's QoS2 PUBLISH whose packet id was just stored: the id and the message go to the
        publisher's replicas as one pending entry (the PUBREC waits for them), tagged durably here, ahead of any
        write of the local routing (a subscriber sharing that replica must not resume with the message while the
        publisher resumes without its id); released by _qos2_settle, at the end of route_remote, once everything
        the message caused is acknowledged."""
        cid = message.publisher
        items = self._q2_stash.get(cid)
        if not items:
            return
        pid, holds, replica_holds = items.pop()  # the packet id stored just before
        if not items:
            del self._q2_stash[cid]
        holds += replica_holds  # placed with the forward holds, released with them
        mark = self.next_mark()
        if not self.assigned.get(cid):
            self._send_qos2(cid, mark, encode_mark_op(mark, packet_id=pid), holds)
            return
        key = f"{mark:020d}/"
        entry = encode(Forward(pid, message, ()))  # seq = its packet id: a copy without the id has released it
        self._stranded.setdefault(cid, {})[key] = entry
        self.inner.kv_put(Q2_TAGS, f"{mark:020d}", encode_texts(cid, message.msg_id))
        self._send_qos2(cid, mark, encode_mark_op(mark, packet_id=pid, entry=entry), holds)
        self._q2_settle = (cid, key)

    def _qos2_settle(self) -> None:
        """End of route_remote: once everything the QoS2 message caused is acknowledged (the PUBREC follows, with
        no wait of its own), its pending entry is released."""
        assert self._q2_settle is not None
        cid, key = self._q2_settle
        self._q2_settle = None
        self.store.after_commit(self._qos2_settled, cid, key)

    def _ingress_peer_down(self, peer: str) -> None:
        """A replica that had not acknowledged a packet id is gone: the session is re-replicated at once to its new
        replicas (a snapshot carries the id and the pending message) and the holds wait for them instead; their
        own streams are released, the snapshot going out ahead of the held forwards. The replicas it leaves drop
        their copies once their links are back."""
        for mark, entry in list(self._unconfirmed.items()):
            if peer not in entry[1]:
                continue
            entry[1].discard(peer)
            if entry[1]:
                continue
            cid = entry[0]
            links = self.svc.links
            new = [p for p in self._placement(cid) if links.is_up(p)]
            if not new or self.broker is None or cid not in self.broker.sessions:
                self._q2_acked(mark, peer)  # nothing left to resume from: holding has no purpose
                continue
            for gone in self.assigned.get(cid, []):
                if gone not in new:  # abandoned: it would keep what is released from now on (chaos 30033)
                    self._replicate(gone, cid, OP_DROP, b"", False)  # sent when its link is back
            self.assigned[cid] = new
            entry[1].update(new)
            for held, token in [h for h in entry[2] if h[0] in new]:
                entry[2].remove((held, token))
                self.svc.release(held, token)
            snapshot = self._snapshot(cid)
            for replica in new:
                self._replicate(replica, cid, OP_SNAPSHOT, snapshot, False, self._q2_waiter(replica, mark))

    def _placement(self, cid: str) -> list[str]:
        """The replica nodes of a local session (ClusterWiring)."""
        raise NotImplementedError

    def _snapshot(self, cid: str) -> bytes:
        """OP_SNAPSHOT data of a local session (ClusterWiring)."""
        raise NotImplementedError

    def _qos2_settled(self, cid: str, key: str) -> None:
        """Everything a QoS2 message caused is acknowledged (its PUBREC follows): release the pending entry."""
        self.inner.kv_delete(Q2_TAGS, key[:-1])
        self._release_pending(cid, key)

    def _release_pending(self, cid: str, key: str) -> None:
        entries = self._stranded.get(cid)
        if entries is not None:
            entries.pop(key, None)
            if not entries:
                del self._stranded[cid]
        if self.broker is not None and cid in self.broker.sessions:
            self._session_op(cid, OP_STRANDED_DEL, encode_texts(key), False)

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
        links = self.svc.links
        peers = [p for p in self.assigned.get(pub, []) if links.is_up(p)]
        if not peers and any(links.is_up(p) for p in self._placement(pub)):
            # its replicas are down (the target itself, chaos 30625): re-place them now, the snapshot ahead of this
            peers = [p for p in self._replace(pub) if links.is_up(p)]
        if not peers:
            return []
        mark = self.next_mark()
        key = f"{mark:020d}/{node}"
        entry = frame if frame is not None else encode(fwd)
        self._stranded.setdefault(pub, {})[key] = entry
        self._strand_keys[(node, fwd.seq)] = (pub, key)
        self.inner.kv_put(STRANDED_TAGS, f"{node}/{fwd.seq:020d}", encode_texts(pub, key))
        data = encode_mark_op(mark, key, entry)
        return [(peer, self._replicate(peer, pub, OP_STRANDED_ADD, data, False)) for peer in peers]

    def _unstrand(self, node: str, seq: int) -> None:
        """The target acknowledged a stranded forward (or it left this stream): the replicas let it go."""
        found = self._strand_keys.pop((node, seq), None)
        if found is None:
            return
        pub, key = found
        self.inner.kv_delete(STRANDED_TAGS, f"{node}/{seq:020d}")
        self._release_pending(pub, key)

    def _strand_in_flight(self, peer: str) -> None:
        """`peer` went down with forwards in flight: strand them; a client ack waiting for the peer's ack now waits
        for the publisher's replicas instead (the allow_publish policy then releases the peer's waits)."""
        sender = self.svc.senders.get(peer)
        if sender is None:
            return
        for fwd in sender.resend():
            for replica, rep_seq in self._strand(peer, fwd):
                self.store.chain_wait((peer, fwd.seq, "f"), (replica, rep_seq, "r"))

    def _replicate(self, peer: str, cid: str, op: int, data: bytes, acked: bool, waiter: OnAcked | None = None) -> int:
        """Send one replica operation (ClusterWiring)."""
        raise NotImplementedError

    def snapshot_extras(self, cid: str) -> tuple[int, dict[str, bytes]]:
        """What a snapshot of a local session carries besides its state: the current mark, its stranded messages."""
        return self._mark, dict(self._stranded.get(cid, {}))

    def pass_on_stranded(self, copy: ReplicaCopy) -> int:
        """A session resumed from `copy`: what its owner acknowledged while the targets were unreachable goes on
        now, in the order it was acknowledged, before anything newer of the publisher; return how many."""
        passed = 0
        for key in sorted(copy.stranded):
            frame = copy.stranded[key]
            fwd = decode_body(frame[4], frame[5:])
            if not isinstance(fwd, Forward):
                continue
            message = fwd.message
            if fwd.clients:
                self._onward(message, self._deliver_here(message, fwd.clients))
                passed += 1
                continue
            if fwd.seq and fwd.seq not in copy.qos2:
                # Its packet id was released (PUBREL, which follows the PUBREC, which follows the entry's release):
                # the release missed this copy. Passing it on repeated a completed QoS2 message (chaos 30033).
                continue
            passed += 1
            # a QoS2 message whose routing had not finished: route it again (receivers drop a copy they had)
            if self.broker is not None:
                match = self.broker.router.tree.match(message.topic)
                local = tuple(dict.fromkeys(
                    c for c, _f, opts in match.subscribers
                    if c in self.broker.sessions and not (opts.no_local and c == message.publisher)))
                if local:
                    self._deliver_here(message, local)
            for node, clients in self._targets(message).items():
                self._forward(node, message, tuple(clients))
        return passed

    # -- minority side (chaos seed 30625) -----------------------------------------------------------------------
    def _reaches_half(self) -> bool:
        """At least half of the known members reachable lately (SessionMigration)."""
        raise NotImplementedError

    def _replica_reachable(self, cid: str) -> bool:
        links = self.svc.links
        return any(links.is_up(p) for p in self.assigned.get(cid, ()))

    def minority_refusal(self, message: Message) -> int | None:
        """On a minority side, whatever allow_publish / under_replicated say: a QoS>0 message that only this disk
        would keep for a persistent session (its node unreachable and no reachable replica of the publisher to
        strand it on; or a local session without a reachable replica) is refused, v5 0x83 / 3.1.1 close: the
        majority may resume those sessions meanwhile, and it would reach them after the heal, behind newer ones."""
        if not self.svc.membership.unreachable() or self._reaches_half():
            return None
        links = self.svc.links
        pub = message.publisher
        if any(not links.is_up(node) for node in self._targets(message)) and not self._replica_reachable(pub):
            return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        broker = self.broker
        if broker is not None:
            for cid, _filter, opts in broker.router.tree.match(message.topic).subscribers:
                session = broker.sessions.get(cid)
                if (session is not None and session.persistent and not (opts.no_local and cid == pub)
                        and not self._replica_reachable(cid)):
                    return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        return None

    def _release_for_down(self, peer: str) -> None:
        """`peer` is down: the acks waiting for its replica writes go out (the queue copies are rebuilt on the
        remaining nodes at once) and, with allow_publish = true, those waiting for its forwards once the
        publisher's replicas hold them. Not on a minority side: with the other replicas unreachable too, they would
        rest on this disk only (chaos 30625); they wait for the peer's acks (both streams are resent at link-up) or
        until this node reaches half of the members again."""
        if not self._reaches_half():
            if peer not in self._held_down:
                log.warning("minority side: acks waiting for %s stay held until it or a majority is back", peer)
            self._held_down.add(peer)
            return
        if self.c["allow_publish"]:
            self._strand_in_flight(peer)
            self.store.peer_down(peer, "f")
        self._rebuild_for(peer)
        self.store.peer_down(peer, "r")
        self.store.peer_down(peer, "b")

    def _rebuild_for(self, peer: str) -> None:
        """The acks waiting for replica writes to `peer` (down) wait for a snapshot of those sessions on their new
        reachable replicas instead: released alone, they rested on this disk only until the next rebalance
        (chaos 30625 re-run: the write was a local subscriber's enqueue, the node died before the rebalance)."""
        store, broker, sender = self.store, self.broker, self.svc.replica_senders.get(peer)
        waits = store.open_waits(peer, "rb")
        if not waits or broker is None or sender is None or self.r < 2:
            return
        links, sent = self.svc.links, list[tuple[str, int]]()
        for cid in dict.fromkeys(rep.client_id for rep in sender.resend()):
            session = broker.sessions.get(cid)
            if session is not None and session.persistent and any(links.is_up(p) for p in self._placement(cid)):
                self._replace(cid, sent)
        for key in waits:
            for replica, seq in sent:
                store.chain_wait(key, (replica, seq, "r"))

    def _release_held(self, peer: str) -> None:
        """`peer` is back: once half of the members are reachable, the policy applies to those still down."""
        self._held_down.discard(peer)
        if self._held_down and self._reaches_half():
            held, self._held_down = self._held_down, set()
            links = self.svc.links
            for other in sorted(held):
                if not links.is_up(other):
                    self._release_for_down(other)

    # -- restart ---------------------------------------------------------------------------------------------------
    def restore_ingress(self, kv: dict[str, dict[str, bytes]]) -> None:
        """Tags left by the previous run: hold every stream until they are reconciled with the claims."""
        self._restored_q2 = {k: decode_text_pair(v) for k, v in kv.get(Q2_TAGS, {}).items()}
        self._restored_str = {k: decode_text_pair(v) for k, v in kv.get(STRANDED_TAGS, {}).items()}
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
            if not keeps_forward(self.claims.get(pub), self.node_id, False):
                drop_ids.add(msg_id)
            self.inner.kv_delete(Q2_TAGS, tag)
        drop_fwd: set[tuple[str, int]] = set()
        for tag, (pub, key) in self._restored_str.items():
            node, seq = tag.rsplit("/", 1)
            local = self.broker is not None and pub in self.broker.sessions
            if not keeps_forward(self.claims.get(pub), self.node_id, True):
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
        handed = self._reconcile_handing(drop_ids)
        self.svc.release_all()
        log.info("restart reconciled: %d forwards, %d queued copies and %d handed-over copies dropped (their "
                 "publishers' sessions moved)", dropped, purged, handed)

    def _purge_local(self, drop_ids: set[str]) -> int:
        """Queued copies of dropped QoS2 messages in local sessions (never sent: delivery waited for the replicas)."""
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
