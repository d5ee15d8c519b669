"""Bridge between ClusterService and the Broker: routing, acked forwarding, replicated state, takeover, replicas.

The broker calls the ClusterPort methods (appliance.broker.ports); the service calls back on_replicated /
on_forward / on_member / on_replicate / on_session_message. Everything runs on the node's event loop. Durable
cluster state goes through the node's SQLite store (cluster_kv + meta) in the same group commits as the broker's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from appliance.broker.handover import deliver_forwarded
from appliance.broker.model import Message, SessionRecord
from appliance.broker.topictree import TopicTree
from appliance.cluster import dvv
from appliance.cluster.forwarding import ForwardSender, OnAcked
from appliance.cluster.ownership import (
    FRESH,
    Handing,
    ReplicaCopy,
    SessionClaim,
    claim_order,
    decode_claim,
    decode_copy,
    decode_handing,
    encode_claim,
)
from appliance.cluster.records import decode_delivery, encode_retained
from appliance.cluster.replicated import ReplicatedSpace
from appliance.cluster.service import ClusterCallbacks, ClusterConfig, ClusterService
from appliance.cluster.wire import Forward, decode_body
from appliance.protocol.reason_codes import ReasonCode
from appliance.store import SqliteStore

from .cluster_claims import RETAINED, SESSIONS, ClaimRouting
from .cluster_copies import ReplicaCopies
from .cluster_handover import HANDING, HandoverAnswers
from .cluster_ingress import IngressGuard
from .cluster_replication import QueueReplication
from .cluster_sessions import Lineage, SessionMigration, seq_key
from .cluster_store import ClusterStore, Wait
from .config import Config, parse_hostport

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.broker.ports import EventSink, Snapshot
    from appliance.cluster.wire import ClusterMessage

log = logging.getLogger("appliance.cluster")


class ClusterWiring(QueueReplication, ClaimRouting, SessionMigration, HandoverAnswers, ReplicaCopies, IngressGuard):
    """The cluster side of one broker node (implements appliance.broker.ports.ClusterPort)."""

    def __init__(self, config: Config, inner: SqliteStore, events: EventSink | None, secret: bytes) -> None:
        c = config.values["cluster"]
        self.c = c
        self.node_id = config.node_name
        self.inner = inner
        self.store = ClusterStore(inner)
        self.store.on_session_op = self._session_op
        self.store.on_enqueued = self._note_enqueued
        self.store.is_qos2 = self._is_qos2
        self.store.on_qos2_added = self._qos2_added
        self.events = events
        self.r = int(c["replication_factor"])
        self.clock = time.time
        self.broker: Broker | None = None
        self.remote_tree = TopicTree()
        self.claims: dict[str, SessionClaim] = {}
        self.copies: dict[str, ReplicaCopy] = {}  # replica copies of sessions owned by other nodes
        self.assigned: dict[str, list[str]] = {}  # local persistent session -> its replica nodes
        self._moving: dict[str, tuple[dict[str, int], list[str]]] = {}  # placement moves awaiting their snapshots
        self._origin: dict[str, Lineage] = {}  # client id -> how the session being connected got here
        self._seen: dict[str, OrderedDict[str, None]] = {}  # client id -> ids of messages queued for it here
        self._awaiting: dict[str, str] = {}  # client id -> old owner whose hand-over we await (claim ours, no session)
        self._awaited_acked: dict[str, tuple[str, list[Message]]] = {}  # what that old owner acked for it meanwhile
        self._stand_ins: dict[str, str] = {}  # client id -> old owner ("": unknown) whose late hand-over joins it here
        self._handing: dict[str, Handing] = {}
        self._kept_copies: dict[str, list[str]] = {}
        self._resend_due: dict[str, int] = {}  # hand-overs to resend once a restart is reconciled (HandoverAnswers)
        self._adopted: dict[str, float] = {}
        self._released: dict[str, float] = {}
        self._resumes: dict[str, list[tuple[str, str, int, int]]] = {}  # heal-time holds (SessionMigration)
        self._resume_acked: dict[str, list[tuple[str, Message]]] = {}
        self._ups: dict[str, int] = {}
        self._requests: dict[int, tuple[asyncio.Future[tuple[int, bytes] | None], str, bool]] = {}
        self._request_id = 0
        self._seq_base = int(time.time() * 1_000_000)  # stream seqs keep growing across restarts
        self._rebalance_pending = False
        self._acks_due: dict[tuple[str, type], ClusterMessage] = {}  # (peer, ack type) -> latest cumulative ack
        self._init_ingress()
        self._rep_due: dict[str, int] = {}
        self._fwd_waiters: dict[str, OnAcked] = {}  # peer -> the callback of its forward acks (one per peer)
        self._rep_waiters: dict[str, OnAcked] = {}  # peer -> the callback of its replica acks
        self._removes: dict[str, list[int]] = {}  # session -> delivery seqs released this loop iteration
        self._enqueues: dict[str, tuple[list[str], int, list[bytes]]] = {}  # session -> (replicas, batch id, writes)
        self._batch_id = 0
        self._reconcile_task: asyncio.Task[None] | None = None
        host, port = parse_hostport(c["bind"], "cluster.bind")
        tcp = config.get("listener", "tcp")
        self.config = ClusterConfig(
            node_id=self.node_id, cluster=c["name"], secret=secret, host=host, port=port,
            mqtt_port=parse_hostport(tcp, "listener.tcp")[1] if tcp else None,
            seeds=list(c["seeds"]), mdns=c["mdns"], mdns_ttl=c["mdns_ttl"],
            mdns_addresses=[c["advertise"]] if c["advertise"] else None,
            heartbeat_interval=c["heartbeat_interval"], failure_timeout=c["failure_timeout"],
            anti_entropy_interval=c["anti_entropy_interval"], gc_interval=max(30.0, c["anti_entropy_interval"]),
            spaces=(SESSIONS, RETAINED), tls_ca=c["tls_ca"] or None, tls_cert=c["tls_cert"] or None,
            tls_key=c["tls_key"] or None)
        self.service: ClusterService | None = None

    # -- start-up ------------------------------------------------------------------------------------------------
    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild the service from the durable cluster state (before the broker serves anyone)."""
        kv = self.inner.load_kv()
        meta = snapshot.meta
        spaces = {}
        for name in (SESSIONS, RETAINED):
            clocks = {k: dvv.decode(v) for k, v in kv.get(f"dvv/{name}", {}).items()}
            spaces[name] = ReplicatedSpace(name, self.node_id, counter=int(meta.get(f"cluster.counter.{name}", "0")),
                                           clocks=clocks, grace=self.config.tombstone_grace)
        in_transit: dict[str, list[Forward]] = {}
        for ns, rows in kv.items():
            if ns.startswith("fwd/"):
                msgs = [decode_body(v[4], v[5:]) for v in rows.values()]
                in_transit[ns[4:]] = [m for m in msgs if isinstance(m, Forward)]
            elif ns == "rs":
                for cid, value in rows.items():
                    copy = decode_copy(value)
                    for qv in kv.get(f"rq/{cid}", {}).values():
                        d = decode_delivery(qv)
                        copy.queue[d.seq] = d
                    copy.stranded.update(kv.get(f"rx/{cid}", {}))
                    self.copies[cid] = copy
        committed = {k[len("cluster.fwd."):]: int(v) for k, v in meta.items() if k.startswith("cluster.fwd.")}
        callbacks = ClusterCallbacks(on_replicated=self._on_replicated, on_forward=self._on_forward,
                                     on_forward_released=self._on_forward_released, on_member=self._on_member,
                                     on_replicate=self._on_replicate, on_session_message=self._on_session_message)
        self.service = ClusterService(
            self.config, callbacks, spaces=spaces, in_transit=in_transit,
            next_seq={p: self._seq_base for p in in_transit}, committed_upto=committed)
        for k, v in meta.items():
            if k.startswith("cluster.rep."):
                peer = k[len("cluster.rep."):]
                self.service.restore_replication(peer, next_seq=self._seq_base, committed_upto=int(v))
        for cid, value in spaces[SESSIONS].items(claim_order).items():
            self._apply_claim(cid, decode_claim(value), restoring=True)
        self.restore_ingress(kv)
        for cid, value in kv.get(HANDING, {}).items():  # unconfirmed hand-overs: resent when their takers link up
            self._handing[cid] = decode_handing(value)
            self._released[cid] = time.monotonic()
        if self.broker is not None:
            for cid, session in self.broker.sessions.items():
                for delivery in [*session.inflight.values(), *session.queue]:
                    self._note_enqueued(cid, delivery)
            for cid, claim in list(self.claims.items()):  # our claim came before its hand-over, then we restarted
                if claim.owner == self.node_id and claim.persistent and cid not in self.broker.sessions:
                    self._stand_in(cid, "")  # whose hand-over we await is forgotten: messages for it go here

    def attach(self, broker: Broker) -> None:
        """The broker this wiring serves (constructed with self.store and self as its cluster port)."""
        self.broker = broker

    async def async_start(self) -> None:
        """Start links, discovery and rounds."""
        assert self.service is not None
        await self.service.async_start()
        self._schedule_rebalance()
        if self._reconciled is not None:
            self._reconcile_task = asyncio.get_running_loop().create_task(self.async_reconcile())

    async def async_settle(self) -> None:
        """Before clients are served: a node that restarts with sessions gets a bounded moment (2 x failure_timeout)
        to link up and exchange digests, so it does not serve a session another node took over meanwhile."""
        broker = self.broker
        if self._reconciled is not None:
            await self._reconciled.wait()  # bounded: async_reconcile gives up waiting for peers
        if broker is None or not broker.sessions:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.c["failure_timeout"]
        while loop.time() < deadline and not self.svc.links.up_peers():
            await asyncio.sleep(0.05)
        if self.svc.links.up_peers():
            await asyncio.sleep(min(1.0, self.c["failure_timeout"]))  # digests answered, repairs applied
        log.info("cluster view settled: %d peers up", len(self.svc.links.up_peers()))

    async def async_stop(self) -> None:
        """Goodbye to peers and mDNS."""
        if self.service is not None:
            await self.service.async_stop()

    @property
    def svc(self) -> ClusterService:
        """The running service."""
        assert self.service is not None
        return self.service

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, **fields)

    def _live(self) -> list[str]:
        return self.svc.membership.live()

    # -- ClusterPort: routing and policies -----------------------------------------------------------------------
    def _targets(self, message: Message) -> dict[str, list[str]]:
        """Remote node -> its sessions with a matching subscription."""
        by_node: dict[str, list[str]] = {}
        match = self.remote_tree.match(message.topic)
        for client_id, _filter, options in match.subscribers:
            if options.no_local and client_id == message.publisher:
                continue
            claim = self.claims.get(client_id)
            if claim is None:
                continue
            node = claim.owner if claim.owner != self.node_id else self._awaited(client_id)
            if node is not None:
                clients = by_node.setdefault(node, [])
                if client_id not in clients:
                    clients.append(client_id)
        return by_node

    def publish_refusal(self, message: Message) -> int | None:
        """allow_publish = false: refuse while a target node is down; under_replicated = refuse: while < R live;
        and on a minority side what this disk alone would keep (minority_refusal)."""
        if not self.c["allow_publish"]:
            links = self.svc.links
            if any(not links.is_up(node) for node in self._targets(message)):
                return ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        if self.c["under_replicated"] == "refuse" and self.r > 1 and len(self._live()) < self.r:
            return ReasonCode.QUOTA_EXCEEDED
        return self.minority_refusal(message)

    def remote_shared(self, topic: str) -> list[tuple[str, str, dict[str, bool]]]:
        """Shared groups with members owned by other nodes that match `topic`, each with its node's reachability."""
        match = self.remote_tree.match(topic)
        if not match.shared:
            return []
        links = self.svc.links
        groups = []
        for group, topic_filter, members in match.shared:
            reachable = {}
            for client_id in members:
                claim = self.claims.get(client_id)
                if claim is not None and claim.owner != self.node_id:
                    reachable[client_id] = links.is_up(claim.owner)
            if reachable:
                groups.append((group, topic_filter, reachable))
        return groups

    def route_remote(self, message: Message, shared: list[str]) -> int:
        """Forward to every node with a matching subscriber or a chosen shared-group member (point to point); return
        the sessions reached."""
        if message.retain:
            self.retained_changed(message)
        targets = self._targets(message)
        for client_id in shared:
            claim = self.claims.get(client_id)
            if claim is not None and claim.owner != self.node_id:
                clients = targets.setdefault(claim.owner, [])
                if client_id not in clients:
                    clients.append(client_id)
        reached = 0
        for node, clients in targets.items():
            self._forward(node, message, tuple(clients))
            reached += len(clients)
        if self._q2_settle is not None:
            self._qos2_settle()
        return reached

    def _forward(self, node: str, message: Message, clients: tuple[str, ...]) -> list[Wait]:
        """Durably buffer and send one Forward; a QoS>0 one gates the next ack unless the policy lets it go (the
        waits it registered are returned)."""
        svc = self.svc
        if node not in svc.senders:
            svc.senders[node] = ForwardSender(node, next_seq=self._seq_base)
        store = self.store
        waiter = self._fwd_waiters.get(node)
        if waiter is None:
            waiter = self._fwd_waiters[node] = lambda seq, _st: store.wait_done(node, seq, "f")
        fwd, frame = svc.forward_frame(node, message, clients, waiter)
        waits: list[Wait] = []
        if message.qos:
            self.inner.kv_put(f"fwd/{node}", seq_key(fwd.seq), frame)
            if svc.links.is_up(node) or not self.c["allow_publish"]:
                waits.append((node, fwd.seq, "f"))
            else:  # acknowledged with the target unreachable: its publisher's replicas keep it too
                waits.extend((replica, rep_seq, "r") for replica, rep_seq in self._strand(node, fwd, frame))
            for wait in waits:
                store.add_wait(*wait)
        self._emit("forwarded", message=message, peer_node=node)
        return waits

    def _refusal_while_split(self, allowed: bool) -> int | None:
        if allowed or not self.svc.membership.unreachable():
            return None
        return ReasonCode.UNSPECIFIED_ERROR

    def subscribe_refusal(self) -> int | None:
        """allow_subscribe = false: refuse while a known node is down."""
        return self._refusal_while_split(self.c["allow_subscribe"])

    def unsubscribe_refusal(self) -> int | None:
        """allow_unsubscribe = false: refuse while a known node is down."""
        return self._refusal_while_split(self.c["allow_unsubscribe"])

    def session_changed(self, record: SessionRecord, connected: bool = False) -> None:
        """Claim the session cluster-wide with its current subscriptions. Every CONNECT is a new claim (the latest
        connection wins after a split); one that did not fetch the session from its previous owner or a replica is
        FRESH, so a node whose claim it beats hands over its whole queue (late or duplicated, never lost)."""
        cid = record.client_id
        current = self.claims.get(cid)
        mine = current is not None and current.owner == self.node_id
        lineage: Lineage = (FRESH, {}, {})
        if mine and current is not None:
            lineage = (current.origin, current.bases, current.marks)  # the same session, continued here
        epoch = current.epoch if mine and current is not None and not connected else self.clock()
        if connected:
            lineage = self._origin.pop(cid, lineage)
        origin, bases, marks = lineage
        claim = SessionClaim(self.node_id, epoch, origin, record.expiry_interval > 0, dict(record.subscriptions),
                             dict(bases), dict(marks))
        if claim != current:
            self.svc.put(SESSIONS, cid, encode_claim(claim))

    def session_removed(self, client_id: str) -> None:
        """A session owned here ended: tombstone its claim."""
        claim = self.claims.get(client_id)
        if claim is not None and claim.owner == self.node_id:
            self.svc.delete(SESSIONS, client_id)

    def retained_changed(self, message: Message) -> None:
        """Replicate a retained message (an empty payload deletes it cluster-wide)."""
        space = self.svc.spaces[RETAINED]
        if message.payload:
            self.svc.put(RETAINED, message.topic, encode_retained(message))
        elif space.value(message.topic) is not None:
            self.svc.delete(RETAINED, message.topic)

    # -- forwarding ----------------------------------------------------------------------------------------------
    def _on_forward(self, peer: str, fwd: Forward) -> None:
        """Enqueue a forwarded message durably (replicas included), then ack it; moved subscribers get it onward."""
        broker = self.broker
        assert broker is not None
        self.store.begin_own_acks()
        missing = self._deliver_here(fwd.message, fwd.clients)
        orphans = tuple(c for c in missing if self._awaiting.get(c) == peer)
        if orphans:  # their hand-overs would have come first on this link: the sender has none (lost in a restart)
            for cid in orphans:
                self._stand_in(cid, peer)  # sending the message back would loop between us; dropping it lost it
            self._deliver_here(fwd.message, orphans)
            missing = [c for c in missing if c not in orphans]
        self._onward(fwd.message, missing)
        self.inner.set_meta(f"cluster.fwd.{peer}", str(fwd.seq))
        self.store.after_own_acks(self._forward_committed, peer, fwd.seq)

    def _deliver_here(self, message: Message, clients: tuple[str, ...]) -> list[str]:
        """Deliver a forwarded message to the named local sessions that have not had it yet; return the named
        clients with no session here. A message can reach a session twice when a forward in flight is retargeted
        after its subscriber moved, or handed over by a node whose claim lost; the second copy is dropped. Only a
        session that took it remembers its id: one that did not (no subscription matched, QoS 0 offline, queue
        full) must not drop a later copy it would take."""
        broker = self.broker
        assert broker is not None
        sessions = broker.sessions
        fresh = tuple(c for c in clients if c in sessions and not self._had(c, message.msg_id))
        for cid in deliver_forwarded(broker, message, fresh) if fresh else ():
            self._remember(cid, message.msg_id)
        return [c for c in clients if c not in sessions]

    def _forward_committed(self, peer: str, seq: int) -> None:
        """A received forward is durable here (and on the replicas): its cumulative ack goes out with the batch."""
        self.svc.forward_committed(peer, seq, self._ack_later)

    def _replica_committed(self, peer: str, seq: int) -> None:
        """Replica writes up to seq are durable here: ack them with the batch (refusals are never produced here)."""
        self.svc.replicate_committed_through(peer, seq, self._ack_later)

    def _ack_later(self, peer: str, ack: ClusterMessage) -> None:
        """Acks are cumulative: one per peer and stream (ack type) per loop iteration is enough."""
        if not self._acks_due:
            asyncio.get_running_loop().call_soon(self._flush_acks)
        self._acks_due[(peer, type(ack))] = ack

    def _flush_acks(self) -> None:
        due, self._acks_due = self._acks_due, {}
        for (peer, _kind), ack in due.items():
            self.svc.send(peer, ack)

    def _onward(self, message: Message, clients: list[str]) -> None:
        """Forward a message to the current owners of clients that are not here (the sender too, if it took one
        over; to the old owner of one whose hand-over we await)."""
        onward: dict[str, list[str]] = {}
        for cid in clients:
            claim = self.claims.get(cid)
            if claim is None:
                continue
            node = claim.owner if claim.owner != self.node_id else self._awaited(cid)
            if node is not None:
                onward.setdefault(node, []).append(cid)
            elif self.broker is not None and cid not in self.broker.sessions:
                self._nowhere(message, cid, claim)
        for node, named in onward.items():
            self._forward(node, message, tuple(named))

    def _on_forward_released(self, peer: str, released: list[Forward]) -> None:
        """The peer acked: drop the forwards from the durable in-transit buffer."""
        if self._resumes:
            self._acked_during_hold(peer, released)
        if self._awaiting:
            self._acked_while_awaited(peer, released)
        for fwd in released:
            if fwd.message.qos:
                self.inner.kv_delete(f"fwd/{peer}", seq_key(fwd.seq))
                if self._strand_keys:
                    self._unstrand(peer, fwd.seq)
            self._emit("forward_acked", message=fwd.message, peer_node=peer)

    # -- membership ----------------------------------------------------------------------------------------------
    def _on_member(self, peer: str, up: bool) -> None:
        """Peer up / down: events, policy on pending acks, re-replication."""
        self._emit("peer_up" if up else "peer_down", peer_node=peer)
        log.info("peer %s %s", peer, "up" if up else "down")
        if up:
            self._ups[peer] = self._ups.get(peer, 0) + 1
            self._resend_handovers(peer)
            self._release_held(peer)
        if not up:
            if self._fenced():
                self._fence_subscribers()  # before the waits below release sends the replicas cannot know of
            if not self.svc.links.is_up(peer):  # else a replaced link: the streams are resent at once on the new one,
                # whose acks what waits for the peer keeps waiting for (released here, a PUBACK went out before the
                # replica held what the old link lost: chaos seed 40071)
                self._ingress_peer_down(peer)
                self._release_for_down(peer)
            for request_id, (future, asked, _clean) in list(self._requests.items()):
                if asked == peer and not future.done():
                    future.set_result(None)
                    self._requests.pop(request_id, None)
        self._schedule_rebalance()

    # -- status --------------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """`cluster show` / GET /cluster: members, replication state, digests of the replicated spaces."""
        svc = self.svc
        broker = self.broker
        spaces = {}
        for name, space in svc.spaces.items():
            clocks = space.clocks()
            h = hashlib.sha256()
            for key in sorted(clocks):
                h.update(key.encode() + b"\0" + dvv.encode(clocks[key]) + b"\0")
            live = hashlib.sha256()
            for key, value in sorted(space.items().items()):
                live.update(key.encode() + b"\0" + value + b"\0")
            spaces[name] = {"keys": len(clocks), "live": len(space.items()), "digest": h.hexdigest(),
                            "live_digest": live.hexdigest()}
        persistent = [c for c, s in (broker.sessions.items() if broker else []) if s.persistent]
        short = sum(1 for c in persistent if len(self.assigned.get(c, [])) < self.r - 1)
        return {
            "node": self.node_id,
            "cluster": self.c["name"],
            "replication_factor": self.r,
            "members": svc.status(),
            "sessions_owned": len(broker.sessions) if broker else 0,
            "replica_copies": len(self.copies),
            "under_replicated": short,
            "acks_waiting": self.store.gated,
            "spaces": spaces,
            "owners": {cid: c.owner for cid, c in sorted(self.claims.items())[:1000]},
        }
