"""The cluster side of one node: discovery, peer links, membership, replicated spaces and forwarding streams, wired.

The broker / server layer gives callbacks (persist and apply what changed, enqueue what was forwarded) and calls
put / delete / forward / forward_committed. Flows run here:
- link up: digests of every space to the peer (anti-entropy), resend of the peer's forwarding buffer;
- periodically: digests to every live peer, tombstone GC against all known members;
- local put / delete: applied, reported through on_replicated, pushed to every live peer at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from appliance.broker.model import Message

from .discovery import Discovery, PeerInfo, parse_seeds
from .dvv import DVVSet, VersionVector
from .forwarding import ForwardReceiver, ForwardSender, OnAcked, ReplicaReceiver, ReplicaSender
from .membership import Membership
from .peerlinks import PeerLinks, mutual_tls_contexts
from .replicated import ReplicatedSpace
from .wire import ClusterMessage, Digest, Forward, ForwardAck, Repair, RepairRequest, ReplAck, Replicate, encode

_LOG = logging.getLogger("appliance.cluster")
DIGEST_CHUNK = 500  # keys per Digest / Repair frame


_T = TypeVar("_T")
SendAck = Callable[[str, ClusterMessage], object]  # (peer, ack): how a stream ack leaves


def _entry(table: dict[str, _T], peer: str, make: Callable[[str], _T]) -> _T:
    """table[peer], created by make(peer) the first time (setdefault would build one on every call)."""
    found = table.get(peer)
    if found is None:
        found = table[peer] = make(peer)
    return found


@dataclass(slots=True)
class ClusterConfig:
    """Cluster settings of one node."""

    node_id: str
    cluster: str
    secret: bytes
    host: str = "0.0.0.0"
    port: int = 7946  # peer-link listener; 0 = any free port
    mqtt_port: int | None = 1883
    mqtts_port: int | None = None
    seeds: list[str] = field(default_factory=list)  # "host[:port]" for networks without multicast
    mdns: bool = True
    mdns_ttl: int = 120
    mdns_addresses: list[str] | None = None
    heartbeat_interval: float = 1.0
    failure_timeout: float = 5.0
    anti_entropy_interval: float = 30.0
    gc_interval: float = 60.0
    tombstone_grace: float = 600.0
    spaces: tuple[str, ...] = ("subs", "retained")
    # Mutual TLS on peer links with the cluster CA from provisioning (all three, or none for plain TCP).
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None


def _noop(*_: Any) -> None:
    """Default callback."""


@dataclass(slots=True)
class ClusterCallbacks:
    """What the node above the cluster layer does when the cluster reports something. All run on the loop."""

    # A key's clock changed (local or remote write, repair) or was collected (None): persist it (dvv.encode) and
    # the space's counter, and apply dvv.resolve(clock) to the broker's state.
    on_replicated: Callable[[str, str, DVVSet | None], None] = _noop
    # A Forward arrived: enqueue it durably, then call forward_committed(peer, fwd.seq).
    on_forward: Callable[[str, Forward], None] = _noop
    # Forwards the peer has acknowledged: delete them from the durable in-transit buffer.
    on_forward_released: Callable[[str, list[Forward]], None] = _noop
    # A peer's link went up / down.
    on_member: Callable[[str, bool], None] = _noop
    # A queue operation from a session owner arrived: commit it, then call replicate_committed(peer, seq, status).
    on_replicate: Callable[[str, Replicate], None] = _noop
    # Replication operations the replica has acknowledged (or refused: see each waiter's status).
    on_replicate_released: Callable[[str, list[Replicate]], None] = _noop
    # Session takeover / migration messages (SessionTakeover / SessionState / SessionDone), handled above this layer.
    on_session_message: Callable[[str, ClusterMessage], None] = _noop


class ClusterService:
    """All cluster machinery of one node; construct with restored state, then async_start()."""

    def __init__(self, config: ClusterConfig, callbacks: ClusterCallbacks, *,
                 spaces: Mapping[str, ReplicatedSpace] | None = None,
                 in_transit: Mapping[str, Iterable[Forward]] | None = None,
                 next_seq: Mapping[str, int] | None = None,
                 committed_upto: Mapping[str, int] | None = None) -> None:
        self.config = config
        self.cb = callbacks
        self.node_id = config.node_id
        self.membership = Membership(config.node_id)
        self.spaces: dict[str, ReplicatedSpace] = {
            name: ReplicatedSpace(name, config.node_id, grace=config.tombstone_grace) for name in config.spaces}
        self.spaces.update(spaces or {})
        self.senders: dict[str, ForwardSender] = {}
        for peer in set(in_transit or {}) | set(next_seq or {}):
            self.senders[peer] = ForwardSender(peer, next_seq=(next_seq or {}).get(peer, 1),
                                               in_transit=(in_transit or {}).get(peer, ()))
        self.receivers: dict[str, ForwardReceiver] = {
            peer: ForwardReceiver(peer, committed_upto=n) for peer, n in (committed_upto or {}).items()}
        # Queue replication streams (issue 4); restore them like the forwarding ones via restore_replication().
        self.replica_senders: dict[str, ReplicaSender] = {}
        self.replica_receivers: dict[str, ReplicaReceiver] = {}
        tls = None
        if config.tls_ca or config.tls_cert or config.tls_key:
            if not (config.tls_ca and config.tls_cert and config.tls_key):
                raise ValueError("cluster TLS needs tls_ca, tls_cert and tls_key together")
            tls = mutual_tls_contexts(config.tls_ca, config.tls_cert, config.tls_key)
        self.links = PeerLinks(config.node_id, config.cluster, config.secret, host=config.host, port=config.port,
                               on_up=self._link_up, on_down=self._link_down, on_message=self._message,
                               heartbeat_interval=config.heartbeat_interval, timeout=config.failure_timeout,
                               tls=tls)
        self.discovery: Discovery | None = None
        # Held streams: Forward / Replicate frames to a held peer ("*": every peer) stay buffered, unsent, until
        # released (a QoS2 packet id not yet on its replica; a restarted node reconciling its durable forwards).
        # peer -> holds in order: [token, first forward seq held, 1 if a replica hold (then the seq is that stream's)]
        self._barriers: dict[str, list[list[int]]] = {}
        self._hold_seq = 0
        self._hold_all = False
        self._unsent: dict[tuple[str, str], int] = {}  # (peer, "f" / "r") -> first seq held back, not yet sent
        self._resending: set[str] = set()  # peers whose link-up is being reported: their streams wait for the resend
        # peer -> [(holds it waits for (0: hold_all), its own forward hold, message)] in order (send_behind_holds)
        self._behind: dict[str, list[tuple[set[int], int, ClusterMessage]]] = {}
        self._digest_parts: dict[tuple[str, str], list[tuple[str, VersionVector]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- life cycle ----------------------------------------------------------------------------------------------
    async def async_start(self) -> None:
        """Listen, announce, browse, dial seeds, start the periodic rounds."""
        port = await self.links.async_start()
        for host, seed_port in parse_seeds(self.config.seeds, self.config.port or port):
            self.links.async_add_seed(host, seed_port)
        if self.config.mdns:
            self.discovery = Discovery(cluster=self.config.cluster, node_id=self.node_id, cluster_port=port,
                                       mqtt_port=self.config.mqtt_port, mqtts_port=self.config.mqtts_port,
                                       addresses=self.config.mdns_addresses, ttl=self.config.mdns_ttl,
                                       on_add=self._discovered, on_update=self._discovered, on_remove=self._vanished)
            await self.discovery.async_start()
        self._spawn(self._async_periodic(self.config.anti_entropy_interval, self._async_anti_entropy_round))
        self._spawn(self._async_periodic(self.config.gc_interval, self._async_gc_round))

    async def async_stop(self) -> None:
        """Stop rounds, say goodbye on mDNS and on every link."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.discovery is not None:
            await self.discovery.async_stop()
        await self.links.async_stop()

    @property
    def port(self) -> int:
        """The peer-link port actually bound."""
        return self.links.port

    def async_add_seed(self, host: str, port: int) -> None:
        """Add a static peer address at run time. Loop only."""
        self.links.async_add_seed(host, port)

    def forget_member(self, node_id: str) -> None:
        """A node is decommissioned for good: drop it from membership so tombstone GC stops waiting for it."""
        self.membership.forget(node_id)
        for space in self.spaces.values():
            space.forget_member(node_id)

    # -- replicated state ----------------------------------------------------------------------------------------
    def put(self, space: str, key: str, value: bytes, context: Mapping[str, int] | None = None) -> DVVSet:
        """Write locally, report through on_replicated, push to every live peer."""
        clock = self.spaces[space].put(key, value, context)
        self._changed(space, {key: clock}, push=True)
        return clock

    def delete(self, space: str, key: str, context: Mapping[str, int] | None = None) -> DVVSet:
        """Delete locally (tombstone), report, push."""
        clock = self.spaces[space].delete(key, context)
        self._changed(space, {key: clock}, push=True)
        return clock

    def _changed(self, space: str, clocks: Mapping[str, DVVSet], push: bool) -> None:
        """Report changed clocks upward and, for local writes, push them to live peers."""
        for key, clock in clocks.items():
            self.cb.on_replicated(space, key, clock)
        if push and clocks:
            msg = Repair(space, tuple(clocks.items()))
            for peer in self.links.up_peers():
                self.links.async_send(peer, msg)

    def _send_digest(self, peer: str, space: str) -> None:
        """Our digest of one space, in chunks."""
        entries, collected = self.spaces[space].digest()
        chunks = [entries[i : i + DIGEST_CHUNK] for i in range(0, len(entries), DIGEST_CHUNK)] or [()]
        for n, chunk in enumerate(chunks):
            last = n == len(chunks) - 1
            self.links.async_send(peer, Digest(space, chunk, last, collected if last else ()))

    def _on_digest(self, peer: str, msg: Digest) -> None:
        """Collect a digest's chunks; on the last one, remember it and answer with repairs and requests."""
        space = self.spaces.get(msg.space)
        if space is None:
            return
        parts = self._digest_parts.setdefault((peer, msg.space), [])
        parts.extend(msg.entries)
        if not msg.final:
            return
        del self._digest_parts[(peer, msg.space)]
        space.observe_digest(peer, parts, msg.collected)
        plan = space.plan_repair(parts, complete=True, collected=msg.collected)
        clocks = space.clocks_for(plan.push)
        for i in range(0, len(clocks), DIGEST_CHUNK):
            self.links.async_send(peer, Repair(msg.space, clocks[i : i + DIGEST_CHUNK]))
        for i in range(0, len(plan.request), DIGEST_CHUNK):
            self.links.async_send(peer, RepairRequest(msg.space, tuple(plan.request[i : i + DIGEST_CHUNK])))

    # -- forwarding ----------------------------------------------------------------------------------------------
    def forward(self, peer: str, message: Message, clients: tuple[str, ...] = (),
                on_acked: OnAcked | None = None) -> Forward:
        """Queue a message on the peer's stream (persist the returned Forward), send it if the link is up."""
        return self.forward_frame(peer, message, clients, on_acked)[0]

    def forward_frame(self, peer: str, message: Message, clients: tuple[str, ...] = (),
                      on_acked: OnAcked | None = None) -> tuple[Forward, bytes]:
        """forward(), also returning the encoded frame (persist those bytes: encoded once for both)."""
        sender = _entry(self.senders, peer, ForwardSender)
        fwd = sender.submit(message, clients, on_acked)
        frame = encode(fwd)
        if self._barriers or self._hold_all or self._resending:
            self._defer_or_send(peer, "f", fwd, fwd.seq, frame)
        else:
            self.links.async_send_frame(peer, frame)
        return fwd, frame

    def forward_committed(self, peer: str, seq: int, send: SendAck | None = None) -> None:
        """The durable enqueue of a received Forward is done: ack it (cumulatively) when the prefix grows, through
        `send` (default: at once on the link)."""
        ack = _entry(self.receivers, peer, ForwardReceiver).committed(seq)
        if ack is not None:
            (send or self.links.async_send)(peer, ack)

    def restore_replication(self, peer: str, *, next_seq: int = 1, in_transit: Iterable[Replicate] = (),
                            committed_upto: int = 0) -> None:
        """Restore one peer's replication streams from durable state (before async_start)."""
        self.replica_senders[peer] = ReplicaSender(peer, next_seq=next_seq, in_transit=in_transit)
        self.replica_receivers[peer] = ReplicaReceiver(peer, committed_upto=committed_upto)

    def replicate(self, peer: str, client_id: str, op: int, data: bytes,
                  on_acked: OnAcked | None = None) -> Replicate:
        """Queue one operation for a replica (persist the returned Replicate), send it if the link is up."""
        sender = _entry(self.replica_senders, peer, ReplicaSender)
        rep = sender.submit(client_id, op, data, on_acked)
        if self._barriers or self._hold_all or self._resending:
            self._defer_or_send(peer, "r", rep, rep.seq, None)
        else:
            self.links.async_send(peer, rep)
        return rep

    # -- held streams --------------------------------------------------------------------------------------------
    def _limit(self, peer: str, kind: str) -> int | None:
        """The first seq of the peer's stream `kind` that must not leave yet (None: nothing is held)."""
        if self._hold_all:
            return 0
        barriers = self._barriers.get(peer)
        wanted = 1 if kind == "r" else 0  # hold() never covers replica streams: they carry what releases it
        firsts = [barrier[1] for barrier in barriers or () if barrier[2] == wanted]
        return min(firsts) if firsts else None

    def _defer_or_send(self, peer: str, kind: str, msg: ClusterMessage, seq: int, frame: bytes | None) -> None:
        if peer in self._resending:
            return  # submitted while its link-up is reported: the resend that follows sends it, in order
        limit = self._limit(peer, kind) if (self._hold_all or self._barriers) else None
        if limit is not None and seq >= limit:
            key = (peer, kind)
            first = self._unsent.get(key)
            if first is None or seq < first:
                self._unsent[key] = seq
        elif frame is not None:
            self.links.async_send_frame(peer, frame)
        else:
            self.links.async_send(peer, msg)

    def hold(self, peer: str, buffered: bool = False) -> int:
        """Forwards submitted to the peer from now on (with `buffered`, those buffered already too) stay unsent until
        release(peer, token) of every hold that covers them; return the token. Replica operations are not held
        (placed before the operation it waits for, that could make two holds wait for each other: hold_replicas)."""
        self._hold_seq += 1
        sender = self.senders.get(peer)
        first = 0 if buffered or sender is None else sender.next_seq
        self._barriers.setdefault(peer, []).append([self._hold_seq, first, 0])
        return self._hold_seq

    def hold_replicas(self, peer: str) -> int:
        """Replica operations submitted to the peer from now on stay unsent until release(peer, token); return the
        token. Only for operations that must not precede another peer's acknowledgement: a hold placed after the
        operation it waits for was submitted never waits for a later one (holds cannot wait for each other)."""
        self._hold_seq += 1
        sender = self.replica_senders.get(peer)
        first = 0 if sender is None else sender.next_seq
        self._barriers.setdefault(peer, []).append([self._hold_seq, first, 1])
        return self._hold_seq

    def release(self, peer: str, token: int) -> None:
        """Undo one hold(); frames no hold covers any more go out in order, a peer's replica operations first
        (a snapshot that re-replicates a packet id precedes the forwards it held)."""
        barriers = self._barriers.get(peer, [])
        for i, barrier in enumerate(barriers):
            if barrier[0] == token:
                del barriers[i]
                break
        if not barriers:
            self._barriers.pop(peer, None)
        self._flush_held(peer)
        self._send_behind(peer, token)

    def send_behind_holds(self, peer: str, msg: ClusterMessage, buffered: bool = False) -> None:
        """Send a session message that must not overtake what the peer's holds keep back now (a hand-over queue with
        QoS2 messages whose packet ids their publishers' replicas have not acknowledged, chaos seed 70012): it goes
        once they are released, after the replica operations they held; forwards submitted after it follow it (with
        `buffered`, those buffered already too: a resend of a message lost with the link goes ahead of them)."""
        tokens = {barrier[0] for barrier in self._barriers.get(peer, ())} | ({0} if self._hold_all else set())
        if not tokens:
            self.send(peer, msg)
            return
        self._behind.setdefault(peer, []).append((tokens, self.hold(peer, buffered), msg))

    def _send_behind(self, peer: str, token: int) -> None:
        """A hold ended: the messages no earlier hold keeps back go out, in order."""
        waiting = self._behind.get(peer, [])
        for tokens, _own, _msg in waiting:
            tokens.discard(token)
        while waiting and not waiting[0][0]:
            _tokens, own, msg = waiting.pop(0)
            self.send(peer, msg)  # a link that is down meanwhile resends the hand-over at link-up
            self.release(peer, own)
        if not waiting:
            self._behind.pop(peer, None)

    def hold_all(self) -> None:
        """Hold every stream (a restarted node reconciling its durable forwards)."""
        self._hold_all = True

    def release_all(self) -> None:
        """End hold_all(); what no other hold covers goes out."""
        self._hold_all = False
        for peer in {p for p, _k in self._unsent}:
            self._flush_held(peer)
        for peer in list(self._behind):
            self._send_behind(peer, 0)

    def _flush_held(self, peer: str) -> None:
        for kind in ("r", "f"):
            key = (peer, kind)
            first = self._unsent.get(key)
            if first is None:
                continue
            stream = self.senders.get(peer) if kind == "f" else self.replica_senders.get(peer)
            if stream is None or not self.links.is_up(peer) or peer in self._resending:
                del self._unsent[key]  # the (next) link-up resend sends the whole buffer
                continue
            limit = self._limit(peer, kind)
            rest = None
            for msg in stream.resend():
                if msg.seq < first:
                    continue
                if limit is not None and msg.seq >= limit:
                    rest = msg.seq
                    break
                self.links.async_send(peer, msg)
            if rest is None:
                del self._unsent[key]
            else:
                self._unsent[key] = rest

    def _resend(self, peer: str, kind: str, msgs: list[Forward] | list[Replicate]) -> None:
        """Link-up resend of one stream; frames a hold covers wait for its release."""
        self._unsent.pop((peer, kind), None)
        for msg in msgs:
            self._defer_or_send(peer, kind, msg, msg.seq, None)

    def replicate_committed(self, peer: str, seq: int, status: int = 0, send: SendAck | None = None) -> None:
        """A received operation is committed (status 0) or refused: send the acks now due (through `send`)."""
        send = send or self.links.async_send
        for ack in _entry(self.replica_receivers, peer, ReplicaReceiver).committed(seq, status):
            send(peer, ack)

    def replicate_committed_through(self, peer: str, seq: int, send: SendAck | None = None) -> None:
        """Every received operation up to `seq` is committed: send the acks now due (through `send`)."""
        send = send or self.links.async_send
        for ack in _entry(self.replica_receivers, peer, ReplicaReceiver).committed_through(seq):
            send(peer, ack)

    def send(self, peer: str, msg: ClusterMessage) -> bool:
        """Send a session / replication message; False if the peer's link is down."""
        return self.links.async_send(peer, msg)

    # -- status --------------------------------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        """One row per known node for `cluster show`: state, address, rtt, last seen, forwarding lag."""
        links = {row.peer_id: row for row in self.links.status()}
        rows: list[dict[str, Any]] = []
        for node in self.membership.all():
            member = self.membership.member(node)
            link = links.get(node)
            sender = self.senders.get(node)
            address: tuple[str, int] | None
            if node == self.node_id:
                state, address = "self", (self.config.host, self.port)
            else:
                state = "running" if self.links.is_up(node) else "unreachable"
                address = link.address if link is not None and link.address else (member.address if member else None)
            rows.append({
                "node": node,
                "state": state,
                "address": f"{address[0]}:{address[1]}" if address else None,
                "rtt_ms": round(link.rtt * 1000, 3) if link is not None and link.rtt is not None else None,
                "last_seen_s": round(link.last_seen, 3) if link is not None and link.last_seen is not None else None,
                "in_transit": sender.in_transit if sender else 0,
                "lag_s": round(sender.lag(), 3) if sender else 0.0,
            })
        return rows

    # -- events from discovery and links -------------------------------------------------------------------------
    def _discovered(self, peer: PeerInfo) -> None:
        """mDNS found or moved a peer: remember it and keep a link to it."""
        self.membership.known(peer.node_id, (peer.addresses[0], peer.cluster_port), peer.mqtt_port)
        self.links.async_add_peer(peer.node_id, peer.addresses[0], peer.cluster_port)

    def _vanished(self, node_id: str) -> None:
        """mDNS lost a peer; the link layer keeps redialling its last address, liveness comes from the link."""
        _LOG.info("peer %s no longer announced on mDNS", node_id)

    def _link_up(self, peer: str) -> None:
        """A link is up: anti-entropy for every space, report (the wiring resends its session messages), then resend
        the forwarding and replica buffers."""
        self.membership.set_up(peer, True)
        for space in self.spaces:
            self._send_digest(peer, space)
        # Session messages lost with the old link (a hand-over) were sent before the forwards that followed them:
        # resent after those forwards, the hand-over's older messages reached the new owner behind newer ones
        # (chaos seed 30270). Stream writes the report makes go out with the resend, in order: sent first, one (a
        # snapshot re-placing a session held for a peer still down) overtook the resend of what the old link lost,
        # and the peer dropped that as released and acknowledged it (chaos seed 110340: a packet id lost).
        self._resending.add(peer)
        try:
            self.cb.on_member(peer, True)
        finally:
            self._resending.discard(peer)
        sender, rsender = self.senders.get(peer), self.replica_senders.get(peer)
        if sender is not None:
            self._resend(peer, "f", sender.resend())
        if rsender is not None:
            self._resend(peer, "r", rsender.resend())

    def _link_down(self, peer: str, reason: str) -> None:
        """A link is down (or was replaced, then up follows at once)."""
        for key in [k for k in self._digest_parts if k[0] == peer]:
            del self._digest_parts[key]
        if self.membership.set_up(peer, False):
            self.cb.on_member(peer, False)

    def _message(self, peer: str, msg: ClusterMessage) -> None:
        """Dispatch one message from an authenticated peer."""
        if isinstance(msg, Forward):
            receiver = _entry(self.receivers, peer, ForwardReceiver)
            if receiver.accept(msg):
                self.cb.on_forward(peer, msg)
            else:
                dup = receiver.duplicate_ack()
                if dup is not None:
                    self.links.async_send(peer, dup)
        elif isinstance(msg, ForwardAck):
            sender = self.senders.get(peer)
            if sender is not None:
                released = sender.on_ack(msg)
                if released:
                    self.cb.on_forward_released(peer, released)
        elif isinstance(msg, Replicate):
            rreceiver = _entry(self.replica_receivers, peer, ReplicaReceiver)
            if rreceiver.accept(msg):
                self.cb.on_replicate(peer, msg)
            else:
                rdup = rreceiver.duplicate_ack()
                if rdup is not None:
                    self.links.async_send(peer, rdup)
        elif isinstance(msg, ReplAck):
            rsender = self.replica_senders.get(peer)
            if rsender is not None:
                done = rsender.on_ack(msg)
                if done:
                    self.cb.on_replicate_released(peer, done)
        elif isinstance(msg, Digest):
            self._on_digest(peer, msg)
        elif isinstance(msg, RepairRequest):
            space = self.spaces.get(msg.space)
            if space is not None:
                self.links.async_send(peer, Repair(msg.space, space.clocks_for(msg.keys)))
        elif isinstance(msg, Repair):
            space = self.spaces.get(msg.space)
            if space is not None:
                self._changed(msg.space, space.merge_many(msg.clocks), push=False)
        else:
            self.cb.on_session_message(peer, msg)

    # -- periodic rounds -----------------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Start a task and keep a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _async_periodic(self, interval: float, job: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run job every interval seconds; an error is logged and the next round still runs."""
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:
                _LOG.exception("cluster round %s failed", getattr(job, "__name__", job))

    async def _async_anti_entropy_round(self) -> None:
        """Send every space's digest to every live peer."""
        for peer in self.links.up_peers():
            for space in self.spaces:
                self._send_digest(peer, space)
                await asyncio.sleep(0)  # large spaces: let the loop breathe between peers

    async def _async_gc_round(self) -> None:
        """Collect tombstones every known member has seen."""
        members = self.membership.all()
        now = time.time()
        for name, space in self.spaces.items():
            for key in space.collect_garbage(members, now):
                self.cb.on_replicated(name, key, None)


def render_status(rows: list[dict[str, Any]]) -> str:
    """`cluster show` as a text table (the JSON form is the rows themselves)."""
    headers = ["node", "state", "address", "rtt_ms", "last_seen_s", "in_transit", "lag_s"]
    table = [headers] + [["-" if row.get(h) is None else str(row[h]) for h in headers] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table)
