"""Session hand-over for the cluster wiring: replica copies (replica side), takeover and resume from a replica."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from appliance.broker.handover import adopt_session, release_session
from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord
from appliance.cluster.ownership import (
    FRESH,
    FROM_REPLICA,
    MIGRATED,
    OP_DROP,
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
    Handing,
    ReplicaCopy,
    SessionClaim,
    apply_op,
    decode_copy,
    decode_handover,
    decode_qos2_add,
    decode_stranded_add,
    decode_text,
    decode_uint,
    decode_uints,
    decode_update,
    encode_claim,
    encode_copy,
    encode_handing,
    encode_handover,
    extend_lineage,
    extend_marks,
    freshest,
    hands_over,
    queue_position,
)
from appliance.cluster.wire import Forward, Repair, Replicate, SessionDone, SessionState, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService
    from appliance.cluster.wire import ClusterMessage
    from appliance.store import SqliteStore

    from .cluster_store import ClusterStore

log = logging.getLogger("appliance.cluster")
SESSIONS = "sessions"
FROM_OWNER, FROM_COPY, OWNER_UP = 1, 2, 3  # first byte of a SessionState's data (OWNER_UP: "ask the owner")
FROM_HANDOVER = 4  # a copy of what this node handed to the claim's owner, which has not confirmed it durable yet
RELEASED_PUSH_S = 300.0  # a session let go this recently has its claim pushed to every peer that links up
SEEN_PER_SESSION = 16384  # message ids remembered per session, to drop a message that reaches it twice
RESUME_HOLD_TIMEOUTS = 3  # failure_timeouts a resume we did not object to may take (the asker waits 2 for answers)
Lineage = tuple[int, dict[str, int], dict[str, int]]  # (claim origin, bases, ingress marks) of a session connecting
HANDING = "ho"  # KV namespace: client id -> a hand-over not confirmed by its taker (the session's only copy)


def seq_key(seq: int) -> str:
    """A sequence number as a KV key that sorts in numeric order."""
    return f"{seq:020d}"


class SessionMigration:
    """Mixed into ClusterWiring: the replica side of queue replication and the takeover protocol."""

    node_id: str
    c: dict[str, Any]
    broker: Broker | None
    inner: SqliteStore
    store: ClusterStore
    claims: dict[str, SessionClaim]
    copies: dict[str, ReplicaCopy]
    _origin: dict[str, Lineage]
    # client id -> (node taking it over, SessionState data, whether a third node may resume from it) until the taker's
    # SessionDone, which it sends once the session is durable there and on its replicas
    _handing: dict[str, Handing]
    _adopted: dict[str, float]  # client id -> epoch of the hand-over adopted here (a resent one is not re-adopted)
    _stand_ins: dict[str, str]  # client id -> old owner whose hand-over had not come when the session started here
    _released: dict[str, float]  # client id -> when this node let the session go (its claim is pushed on link-up)
    _seen: dict[str, OrderedDict[str, None]]
    _rep_due: dict[str, int]  # peer -> last replica operation applied in this loop iteration
    _resumes: dict[str, list[tuple[str, str, int, int]]]  # client id -> [(asker, owner, token, request)]
    _resume_acked: dict[str, list[tuple[str, Message]]]  # client id -> [(owner, message)] it acked during a hold
    _ups: dict[str, int]  # peer -> how many times its link came up
    r: int
    _requests: dict[int, tuple[asyncio.Future[tuple[int, bytes] | None], str, bool]]
    _request_id: int
    events: Any
    clock: Callable[[], float]
    pass_on_stranded: Callable[[ReplicaCopy], int]  # IngressGuard: what a copy's owner acked for unreachable targets

    @property
    def svc(self) -> ClusterService:
        """The running service (ClusterWiring)."""
        raise NotImplementedError

    def _emit(self, kind: str, **fields: Any) -> None:
        """Delivery-log event (ClusterWiring)."""
        raise NotImplementedError

    def _replica_committed(self, peer: str, seq: int) -> None:
        """Ack a committed replica write (ClusterWiring)."""
        raise NotImplementedError

    def _retarget(self, cid: str, old: str, new: str) -> None:
        """Our buffered forwards for a moved client follow it (ClusterWiring)."""
        raise NotImplementedError

    def _deliver_here(self, message: Message, clients: tuple[str, ...]) -> list[str]:
        """Deliver a forwarded message to local sessions that lack it (ClusterWiring)."""
        raise NotImplementedError

    def _onward(self, message: Message, clients: list[str]) -> None:
        """Forward a message to the owners of clients not here (ClusterWiring)."""
        raise NotImplementedError

    def _awaited(self, cid: str) -> str | None:
        """The old owner whose hand-over of a session of ours has not come yet (ClusterWiring)."""
        raise NotImplementedError



    # -- once per session ---------------------------------------------------------------------------------------
    def _remember(self, cid: str, msg_id: str) -> bool:
        """Record that a message was queued for a session here; False if it already was."""
        seen = self._seen.get(cid)
        if seen is None:
            seen = self._seen[cid] = OrderedDict()
        elif msg_id in seen:
            return False
        seen[msg_id] = None
        if len(seen) > SEEN_PER_SESSION:
            seen.popitem(last=False)
        return True

    def _is_qos2(self, cid: str, packet_id: int | None) -> bool:
        """ClusterStore hook: the delivery in flight under packet_id is QoS2 (its SENT state is replicated)."""
        session = self.broker.sessions.get(cid) if self.broker is not None and self.r > 1 else None
        delivery = session.inflight.get(packet_id) if session is not None and packet_id is not None else None
        return delivery is not None and delivery.qos == 2

    def _note_enqueued(self, cid: str, delivery: Delivery) -> None:
        """ClusterStore hook: every durable enqueue (local routing, adoption, forwards)."""
        self._remember(cid, delivery.message.msg_id)

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

    # -- takeover and migration ----------------------------------------------------------------------------------
    def prepare_connect(self, client_id: str, clean_start: bool) -> Coroutine[Any, Any, int] | None:
        """None when the session is ours or new; else an awaitable of the CONNACK code after fetching it."""
        claim = self.claims.get(client_id)
        if not client_id or claim is None:
            return None
        if claim.owner == self.node_id:
            if not clean_start and claim.subscriptions and self._fenced():
                return self._async_refuse(client_id)
            old = self._awaited(client_id)
            if old is not None and not clean_start:
                return self._async_stand_in(client_id, old)
            return None
        return self._async_takeover(client_id, clean_start, claim)

    async def _async_stand_in(self, cid: str, old: str) -> int:
        """CONNECT for a session of ours whose claim came before its hand-over from `old` (_await_handover): asked
        again, `old` resends it (adopted on arrival, in order). If it cannot (unreachable, or it no longer holds
        one), the session starts here, fresh, and the hand-over joins it if it comes later (late, not lost; before,
        it was taken for one already adopted here and its queue was dropped)."""
        if self.svc.links.is_up(old):
            answer = await self._async_ask(old, cid, False)
            if answer is not None and answer[0] == FROM_OWNER:
                return ReasonCode.SUCCESS  # adopted when the state arrived
        if self._awaited(cid) == old:
            self._stand_ins[cid] = old
            self._origin[cid] = (FRESH, {}, {})  # it does not continue old's state (yet): a loser hands over all
        return ReasonCode.SUCCESS

    def _fenced(self) -> bool:
        """On a minority side (allow_register = true): the majority may resume our subscribers' sessions, so we
        do not serve them meanwhile (two live copies of one session would deliver QoS2 messages twice). Only peers
        heard from lately count: when a node is cut off, its links time out one by one, and the first one down must
        already find the others silent."""
        return bool(self.c["allow_register"]) and not self._reaches_half()

    async def _async_refuse(self, cid: str) -> int:
        log.warning("CONNECT %s refused: this node is on a minority side", cid)
        return ReasonCode.SERVER_UNAVAILABLE

    def _fence_subscribers(self) -> None:
        """This node just became a minority side: its persistent subscribers go to another node (DISCONNECT 0x9C)
        before anything is sent to them that the unreachable replicas cannot know of."""
        broker = self.broker
        if broker is None:
            return
        sent = 0
        for session in list(broker.sessions.values()):
            link = session.link or session.connecting
            if link is not None and session.persistent and session.record.subscriptions:
                link.close(ReasonCode.USE_ANOTHER_SERVER)
                sent += 1
        if sent:
            log.warning("minority side: %d persistent subscribers sent to another node (0x9C)", sent)

    async def _async_ask(self, peer: str, cid: str, clean_start: bool,
                         request_id: int = 0) -> tuple[int, bytes] | None:
        if not request_id:
            self._request_id += 1
            request_id = self._request_id
        future: asyncio.Future[tuple[int, bytes] | None] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = (future, peer, clean_start)
        if not self.svc.send(peer, SessionTakeover(request_id, cid, self.node_id, clean_start)):
            self._requests.pop(request_id, None)
            return None
        try:
            return await asyncio.wait_for(future, self.c["failure_timeout"] * 2)
        except TimeoutError:
            return None
        finally:
            self._requests.pop(request_id, None)

    def _reaches_half(self) -> bool:
        """This node reaches at least half of the known members (itself included; peers count only if heard from
        lately: a node just continued after SIGSTOP still sees its dead links as up): not a minority side."""
        horizon = max(2 * self.c["heartbeat_interval"], 0.75 * self.c["failure_timeout"])
        heard = sum(1 for row in self.svc.links.status()
                    if row.state == "up" and row.last_seen is not None and row.last_seen < horizon)
        return 2 * (1 + heard) >= len(self.svc.membership.all())

    async def _async_takeover(self, cid: str, clean_start: bool, claim: SessionClaim) -> int:
        owner = claim.owner
        if self.svc.links.is_up(owner):
            answer = await self._async_ask(owner, cid, clean_start)
            if answer is not None and (answer[0] == FROM_OWNER or clean_start):
                return ReasonCode.SUCCESS  # an owner's session was adopted when its state arrived
            # No answer: the link dropped (or the owner froze) with the question out; it may have let the session go
            # to us already, and resends the state when the link is back. Any other answer: our claim is stale (the
            # session moved on meanwhile). A fresh session here would lose a queue either way: the client retries.
            log.warning("CONNECT %s refused: %s from its owner %s (retry)", cid,
                        "no answer" if answer is None else "no session", owner)
            return ReasonCode.SERVER_UNAVAILABLE
        if not self.c["allow_register"]:
            log.warning("CONNECT %s refused: owner %s unreachable and allow_register = false", cid, owner)
            return ReasonCode.SERVER_UNAVAILABLE
        if clean_start or not claim.persistent:
            return ReasonCode.SUCCESS
        if not self._reaches_half():
            # A minority side cannot tell a dead owner from a live one behind the split: resuming here would
            # fork the session (the owner keeps queueing for it), so the client is sent to another node.
            log.warning("CONNECT %s refused: owner %s unreachable from this minority side", cid, owner)
            return ReasonCode.SERVER_UNAVAILABLE
        candidates: list[ReplicaCopy] = []
        handed: list[ReplicaCopy] = []  # hand-overs to the owner not confirmed yet (its replicas may lack them)
        local, local_handed = self._held_copy(cid)  # ours: the client may come back to the node that handed it over
        if local is not None:
            candidates.append(local)
            if local_handed:
                handed.append(local)
        peers = [p for p in self.svc.links.up_peers() if p != owner]
        owner_alive = unanswered = False
        ups = self._ups.get(owner, 0)
        asks = {}
        for peer in peers:
            self._request_id += 1
            asks[peer] = self._request_id
        answers = await asyncio.gather(*(self._async_ask(p, cid, False, asks[p]) for p in peers))
        let_go = [p for p, answer in zip(peers, answers, strict=True) if answer is not None and answer[0] != OWNER_UP]
        for answer in answers:
            if answer is None:
                unanswered = True  # that peer might reach the owner: we cannot tell it is gone
                continue
            if answer[0] == FROM_OWNER:
                return ReasonCode.SUCCESS  # a live owner after all (the claim was stale): adopted
            if answer[0] in (FROM_COPY, FROM_HANDOVER):
                candidates.append(decode_copy(answer[1]))
                if answer[0] == FROM_HANDOVER:
                    handed.append(candidates[-1])
            elif answer[0] == OWNER_UP:
                owner_alive = True
        if cid in (self.broker.sessions if self.broker else {}):
            return ReasonCode.SUCCESS
        if owner_alive or unanswered or self._ups.get(owner, 0) != ups or not self._reaches_half():
            # Only our link to the owner is down: the session lives on there, so resuming a copy here would
            # fork it. The client retries (on another node, or here once the link is back). The same if the
            # owner linked up meanwhile (it may have queued our resent forwards as its own) or we were cut off.
            log.warning("CONNECT %s refused: owner %s %s", cid, owner,
                        "is alive but unreachable from here" if owner_alive
                        else "may be alive (a peer did not answer)" if unanswered
                        else "linked up meanwhile" if self._ups.get(owner, 0) != ups else "is beyond a split")
            for peer in let_go:  # they need not hold their forwards to the owner for us any longer
                self.svc.send(peer, SessionDone(asks[peer], cid))
            return ReasonCode.SERVER_UNAVAILABLE
        if not candidates:
            # Nothing reachable holds the session (no replica copy, no unconfirmed hand-over): the client gets a
            # fresh one (session present = 0); what the owner had queued stays there until it returns (chaos 41027:
            # this went unlogged and made the diagnosis slow).
            log.warning("session %s: owner %s unreachable and no copy here or at %s: starting it fresh", cid, owner,
                        ", ".join(sorted(peers)) or "no other peer")
        if candidates:
            best = freshest(candidates)
            assert self.broker is not None
            base = queue_position(best)
            queue = best.deliveries()
            # A hand-over copy holds the owner's state as it got it (its later queue seqs start at `base`), and
            # none of the owner's own ingress: its pending messages stay with it (no ingress mark).
            from_handover = any(best is copy for copy in handed)
            self._origin[cid] = (FROM_REPLICA, extend_lineage(claim.bases, best.owner, base),
                                 dict(claim.marks) if from_handover else extend_marks(claim.marks, best.owner,
                                                                                      best.mark))
            for msg_id in best.seen:  # what the owner queued lately, delivered or not: a late copy is dropped
                self._remember(cid, msg_id)
            adopt_session(self.broker, best.record, queue, sorted(best.qos2))
            if cid in self.copies:
                self._persist_copy(cid, None, Replicate(0, cid, OP_DROP, b""), True)
            if self._handing.get(cid, ("", b"", False))[0] == owner:
                self._handed(cid)  # resumed here: our hand-over to the owner is superseded
            self._retarget(cid, owner, self.node_id)  # now, before any newer local publish reaches the session
            stranded = self.pass_on_stranded(best)  # what the owner acked for unreachable targets, before newer
            self._emit("migrated", subscriber=cid, peer_node=owner, reason="from_replica")
            log.info("session %s resumed from %s (%d queued, %d stranded passed on), owner %s unreachable", cid,
                     "an unconfirmed hand-over" if from_handover else "a replica", len(queue), stranded, owner)
        return ReasonCode.SUCCESS

    def _owner_up_here(self, cid: str, asker: str) -> bool:
        """The session's owner (by our claims) is another node that we reach: the asker only lost its link to it."""
        claim = self.claims.get(cid)
        return (claim is not None and claim.owner not in (self.node_id, asker, "")
                and self.svc.links.is_up(claim.owner))

    def _on_session_message(self, peer: str, msg: ClusterMessage) -> None:
        """SessionTakeover from a node taking a client over; SessionState answers."""
        broker = self.broker
        assert broker is not None
        if isinstance(msg, SessionTakeover):
            cid = msg.client_id
            if cid in broker.sessions:
                image = release_session(broker, cid, msg.clean_start)
                assert image is not None
                record, queue, qos2 = image
                epoch = self.clock()
                current = self.claims.get(cid)
                bases = extend_lineage(current.bases if current else {}, self.node_id, record.next_seq)
                claim = SessionClaim(msg.node, epoch, MIGRATED, record.expiry_interval > 0, dict(record.subscriptions),
                                     bases, dict(current.marks) if current else {})
                # The state goes out before the claim: the new owner adopts the session before its own buffered
                # forwards to us are retargeted to it (delivered into that session, in order).
                seen = list(self._seen.pop(cid, {}))
                data = bytes([FROM_OWNER]) + encode_handover(epoch, record, queue, qos2, seen)
                # Resent on every link-up until the taker says SessionDone (durable there and on its replicas);
                # meanwhile the copy a third node may resume from if the taker dies (unless it starts clean).
                resumable = not msg.clean_start and record.expiry_interval > 0
                self._hand(cid, (peer, data, resumable))
                self._released[cid] = time.monotonic()
                # Behind the holds on the peer's streams: its queue may hold QoS2 messages whose publishers'
                # replicas lack their packet ids (chaos 70012: sent at once, it overtook them; we died, the taker
                # delivered them and the publishers' DUP resends were routed as new).
                self.svc.send_behind_holds(peer, SessionState(msg.request_id, cid, True, data))
                self.svc.put(SESSIONS, cid, encode_claim(claim))
                self._emit("migrated", subscriber=cid, peer_node=msg.node, reason="takeover")
            elif self._handing.get(cid, ("", b"", False))[0] == peer:  # asked again: the state may have been lost
                self.svc.send_behind_holds(peer, SessionState(msg.request_id, cid, True, self._handing[cid][1]))
            elif self._owner_up_here(cid, msg.node):
                claim = self.claims[cid]
                self.svc.send(peer, SessionState(msg.request_id, cid, True, bytes([OWNER_UP]) + claim.owner.encode()))
            elif (answer := self._copy_answer(cid)) is not None:
                self._hold_for_resume(cid, msg.node, msg.clean_start, msg.request_id)
                self.svc.send_behind_holds(peer, SessionState(msg.request_id, cid, True, answer))  # as a hand-over
            else:
                self._hold_for_resume(cid, msg.node, msg.clean_start, msg.request_id)
                self.svc.send(peer, SessionState(msg.request_id, cid, False, b""))
        elif isinstance(msg, SessionState):
            pending = self._requests.get(msg.request_id)
            clean = pending[2] if pending is not None else False
            if msg.present and msg.data[:1] == bytes([FROM_OWNER]):
                waiting = pending is not None and not pending[0].done()
                self._on_handover(peer, msg.client_id, msg.data[1:], clean, waiting)
                # The old owner lets its hand-over state go only once the session is on disk here and on our
                # replicas (the ordered after_commit waits for the replica writes the adoption made): if we die
                # before, it still answers a third node's takeover question with it (FROM_HANDOVER).
                self.store.after_commit(self.svc.send, peer, SessionDone(msg.request_id, msg.client_id))
            if pending is not None and not pending[0].done():
                kind = msg.data[0] if msg.present and msg.data else 0
                pending[0].set_result((kind, msg.data[1:]))
        elif isinstance(msg, SessionDone):
            if msg.request_id and self._end_resume_holds(msg.client_id, peer, msg.request_id):
                return  # the asker did not resume the session after all
            if self._handing.get(msg.client_id, ("", b"", False))[0] == peer:
                self._handed(msg.client_id)

    def _hand(self, cid: str, entry: Handing) -> None:
        """Keep a hand-over until its taker confirms it, on disk too (written right after the session's deletion):
        with the answer lost on a dead link it is the session's only copy (the replicas dropped theirs), and this
        node may be killed and restarted before the link returns."""
        self._handing[cid] = entry
        self.inner.kv_put(HANDING, cid, encode_handing(entry))

    def _handed(self, cid: str) -> None:
        """The taker confirmed the hand-over (or it was superseded): forget it."""
        del self._handing[cid]
        self.inner.kv_delete(HANDING, cid)

    def _held_copy(self, cid: str) -> tuple[ReplicaCopy | None, bool]:
        """What we hold of a session owned elsewhere: our replica copy or, while the claim's owner has not confirmed
        a hand-over we made to it, that hand-over's state (the freshest of the two; True if the hand-over). Our
        hand-over is the session's only copy besides the taker's disk until the taker's replicas hold it (chaos
        10171, 10427: the taker died or was cut off right after the hand-over; the session restarted fresh)."""
        copy = self.copies.get(cid)
        taker, data, resumable = self._handing.get(cid, ("", b"", False))
        claim = self.claims.get(cid)
        if resumable and claim is not None and claim.owner == taker:
            epoch, record, queue, qos2, seen = decode_handover(data[1:])
            handed = ReplicaCopy(taker, epoch, record, {d.seq: d for d in queue}, set(qos2),
                                 seen=OrderedDict.fromkeys(seen))
            for delivery in queue:
                handed.note(delivery.message.msg_id)
            if copy is None or freshest([copy, handed]) is handed:
                return handed, True
        return copy, False

    def _copy_answer(self, cid: str) -> bytes | None:
        """_held_copy as a takeover answer (FROM_HANDOVER / FROM_COPY); None if we hold nothing."""
        copy, handed = self._held_copy(cid)
        return None if copy is None else bytes([FROM_HANDOVER if handed else FROM_COPY]) + encode_copy(copy)

    # -- heal-time hold ------------------------------------------------------------------------------------------
    def _hold_for_resume(self, cid: str, asker: str, clean_start: bool, request_id: int) -> None:
        """We answered `asker` without objecting to its resuming `cid` from a replica (its owner is unreachable
        here). Until its claim arrives (or it gives up, or RESUME_HOLD_TIMEOUTS pass) our forwards to the owner,
        buffered ones included, stay unsent: at a link-up that crossed our answer the owner would queue them as
        its own and hand them over only once it learnt the new claim, after newer ones (chaos 8033). Held, they
        follow the claim (retargeted, in order, before anything newer)."""
        claim = self.claims.get(cid)
        if clean_start or claim is None or not claim.persistent or claim.owner in (self.node_id, asker, ""):
            return
        token = self.svc.hold(claim.owner, buffered=True)
        self._resumes.setdefault(cid, []).append((asker, claim.owner, token, request_id))
        asyncio.get_running_loop().call_later(RESUME_HOLD_TIMEOUTS * self.c["failure_timeout"],
                                              self._end_resume_holds, cid, "", 0, token)

    def _end_resume_holds(self, cid: str, asker: str = "", request_id: int = 0, token: int = 0,
                          owner: str = "") -> bool:
        """Release heal-time holds of `cid`: those of one asker's request, one token, or those for a node that no
        longer owns it (`owner`: the new claim's); forwards no other hold covers go out in order. True if any."""
        kept, ended = [], False
        for entry in self._resumes.get(cid, []):
            if ((asker and (entry[0], entry[3]) != (asker, request_id)) or (token and entry[2] != token)
                    or (owner and owner == entry[1])):
                kept.append(entry)
            else:
                self.svc.release(entry[1], entry[2])
                ended = True
        if kept:
            self._resumes[cid] = kept
        else:
            self._resumes.pop(cid, None)
        held = {entry[1] for entry in kept}
        acked = [item for item in self._resume_acked.pop(cid, []) if item[0] in held]
        if acked:
            self._resume_acked[cid] = acked
        return ended

    def _acked_during_hold(self, peer: str, released: list[Forward]) -> None:
        """`peer` acknowledged forwards while we hold its stream for a resume of a session of its: it read them
        before our answer (then froze, or its link dropped, with its replica's ack out), so the copy the asker
        resumed from may lack them, and `peer` passes them on only once it learns the new claim, after the newer
        forwards our hold kept (chaos 30624, reordered). They follow the claim too, ahead of those (the new owner
        drops a copy it has by message id)."""
        for fwd in released:
            for cid in fwd.clients:
                if any(entry[1] == peer for entry in self._resumes.get(cid, ())):
                    self._resume_acked.setdefault(cid, []).append((peer, fwd.message))

    def _take_acked_during_hold(self, cid: str, old: str) -> list[Message]:
        """The messages `old` acknowledged for `cid` during a hold (_acked_during_hold), oldest first."""
        items = self._resume_acked.pop(cid, [])
        kept = [item for item in items if item[0] != old]
        if kept:
            self._resume_acked[cid] = kept
        return [message for owner, message in items if owner == old]

    def _on_handover(self, peer: str, cid: str, data: bytes, clean: bool, waiting: bool) -> None:
        """The owner let a session go to us: adopt it now, in stream order, even if we gave up asking (it is gone
        there). If we gave up and hold the session already (resumed from a replica meanwhile), merge instead: what
        we lack of its queue joins ours, in order; replacing ours would drop what it queued since. If it moved on
        to a third node meanwhile, that node gets what it lacks."""
        broker = self.broker
        assert broker is not None
        epoch, record, queue, qos2, seen = decode_handover(data)
        stand_in = self._stand_ins.get(cid) in (peer, "") and cid in broker.sessions  # started here without it
        if self._adopted.get(cid) == epoch or (self._have_since(cid, epoch) and not stand_in):
            return  # a resent hand-over we already have (adopted before a restart: the claim says so)
        if clean or record.expiry_interval == 0:
            return
        self._adopted[cid] = epoch
        claim = self.claims.get(cid)
        if (not waiting and cid not in broker.sessions and claim is not None and claim.epoch > epoch
                and claim.owner not in (self.node_id, peer)):
            # The session moved on while this hand-over waited for us (we died before confirming it): adopting it
            # would strand its queue here; what the current owner cannot have goes to it (it drops what it has).
            passed = [d for d in queue if hands_over(claim, peer, d.seq)]
            for delivery in passed:
                self._onward(delivery.message, [cid])
            log.info("session %s: late hand-over by %s passed on to its owner %s (%d of %d queued)", cid, peer,
                     claim.owner, len(passed), len(queue))
            return
        if not waiting and cid in broker.sessions:
            if stand_in:
                del self._stand_ins[cid]
            # a RELEASED delivery reached the client (its PUBREC came back): sent anew it is a QoS2 duplicate
            merged = [d for d in queue if d.state != DeliveryState.RELEASED
                      and (stand_in or claim is None or hands_over(claim, peer, d.seq))]
            for delivery in merged:
                self._onward(delivery.message, self._deliver_here(delivery.message, (cid,)))
            for msg_id in seen:
                self._remember(cid, msg_id)
            log.info("session %s: late hand-over by %s merged (%d of %d queued)", cid, peer, len(merged), len(queue))
            return
        for msg_id in seen:  # what the old owner already queued (and maybe delivered): not again
            self._remember(cid, msg_id)
        current = self.claims.get(cid)
        self._origin[cid] = (MIGRATED, extend_lineage(current.bases if current else {}, peer, record.next_seq),
                             dict(current.marks) if current else {})
        adopt_session(broker, record, queue, qos2)
        log.info("session %s handed over by %s (%d queued)", cid, peer, len(queue))
        # Our forwards still buffered for the old owner join the session now, in order, before any newer local
        # publish (the old owner's acks for the rest follow this state on the link).
        self._retarget(cid, peer, self.node_id)

    def _stand_in(self, cid: str, old: str) -> None:
        """Start a persistent session of ours here from its claim although its hand-over from `old` ("": unknown,
        after a restart) has not come: messages acknowledged for it must not be routed nowhere. If the hand-over
        turns up after all, what it holds joins the session (late, not lost: _on_handover)."""
        broker = self.broker
        assert broker is not None
        claim = self.claims[cid]
        log.warning("session %s: claimed here, no hand-over%s yet: started here from its claim", cid,
                    f" from {old}" if old else "")
        record = SessionRecord(cid, 5, broker.settings.max_session_expiry, subscriptions=dict(claim.subscriptions))
        adopt_session(broker, record, [], [])
        self._stand_ins[cid] = old
        self._emit("migrated", subscriber=cid, reason="stand_in")
        self._retarget(cid, old, self.node_id)  # ends the awaiting; our forwards buffered for `old` join it, in order

    def _nowhere(self, message: Message, cid: str, claim: SessionClaim) -> None:
        """A message for a session whose claim names this node, with no session here and no hand-over awaited (a
        restart in the window of _await_handover forgets whose it awaits): a persistent one starts here, else the
        message is counted as dropped."""
        if claim.persistent:
            self._stand_in(cid, "")
            self._deliver_here(message, (cid,))
            return
        if self.broker is not None:
            self.broker.metrics.drop("cluster_no_session")
        self._emit("dropped", message=message, subscriber=cid, reason="no_session")

    def _have_since(self, cid: str, epoch: float) -> bool:
        """We own the session under a claim at least as recent as a hand-over of that epoch."""
        claim = self.claims.get(cid)
        return (claim is not None and claim.owner == self.node_id and claim.epoch >= epoch
                and self.broker is not None and cid in self.broker.sessions)

    def _resend_handovers(self, peer: str) -> None:
        """A link to `peer` is up: hand-overs it has not confirmed go out again (it adopts each one once), and the
        claims of sessions we let go lately, before any ack of the peer's resent forwards: a sender that learnt the
        new owner only after our acks would send newer messages to it ahead of the ones we pass on (reordering)."""
        for cid, (taker, data, _resumable) in list(self._handing.items()):
            if taker == peer:
                self.svc.send_behind_holds(peer, SessionState(0, cid, True, data))
        horizon = time.monotonic() - RELEASED_PUSH_S
        for cid, at in list(self._released.items()):
            if at < horizon:
                del self._released[cid]
        if self._released:
            clocks = self.svc.spaces[SESSIONS].clocks_for(self._released)
            if clocks:
                self.svc.send(peer, Repair(SESSIONS, clocks))
