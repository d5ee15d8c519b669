"""Taking a session over at CONNECT: from its owner, or resumed from a replica; adopting a session handed to us."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from appliance.broker.handover import adopt_session
from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord
from appliance.cluster.ownership import (
    FRESH,
    FROM_REPLICA,
    MIGRATED,
    OP_DROP,
    Handing,
    ReplicaCopy,
    SessionClaim,
    decode_copy,
    decode_handover,
    extend_lineage,
    extend_marks,
    freshest,
    hands_over,
    queue_position,
)
from appliance.cluster.wire import Replicate, SessionDone, SessionTakeover
from appliance.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService

log = logging.getLogger("appliance.cluster")
SESSIONS = "sessions"
FROM_OWNER, FROM_COPY, OWNER_UP = 1, 2, 3  # first byte of a SessionState's data (OWNER_UP: "ask the owner")
FROM_HANDOVER = 4  # a copy of what this node handed to the claim's owner, which has not confirmed it durable yet
SEEN_PER_SESSION = 16384  # message ids remembered per session, to drop a message that reaches it twice
Lineage = tuple[int, dict[str, int], dict[str, int]]  # (claim origin, bases, ingress marks) of a session connecting


def seq_key(seq: int) -> str:
    """A sequence number as a KV key that sorts in numeric order."""
    return f"{seq:020d}"


class SessionMigration:
    """Mixed into ClusterWiring: the taker's side of the takeover protocol."""

    node_id: str
    c: dict[str, Any]
    broker: Broker | None
    claims: dict[str, SessionClaim]
    copies: dict[str, ReplicaCopy]
    _origin: dict[str, Lineage]
    # client id -> (node taking it over, SessionState data, whether a third node may resume from it) until the taker's
    # SessionDone, which it sends once the session is durable there and on its replicas
    _handing: dict[str, Handing]
    _adopted: dict[str, float]  # client id -> epoch of the hand-over adopted here (a resent one is not re-adopted)
    _stand_ins: dict[str, str]  # client id -> old owner whose hand-over had not come when the session started here
    _seen: dict[str, OrderedDict[str, None]]
    _ups: dict[str, int]  # peer -> how many times its link came up
    r: int
    _requests: dict[int, tuple[asyncio.Future[tuple[int, bytes] | None], str, bool]]
    _request_id: int
    pass_on_stranded: Callable[[ReplicaCopy], int]  # IngressGuard: what a copy's owner acked for unreachable targets
    _held_copy: Callable[[str], tuple[ReplicaCopy | None, bool]]  # HandoverAnswers: what we hold of a session
    _handed: Callable[[str], None]  # HandoverAnswers: forget a confirmed (or superseded) hand-over
    _persist_copy: Callable[[str, ReplicaCopy | None, Replicate, bool], None]  # ReplicaCopies: write a copy's change

    @property
    def svc(self) -> ClusterService:
        """The running service (ClusterWiring)."""
        raise NotImplementedError

    def _emit(self, kind: str, **fields: Any) -> None:
        """Delivery-log event (ClusterWiring)."""
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

    def _take_awaited_acked(self, cid: str, old: str) -> list[Message]:
        """What `old` acknowledged for the session while its hand-over was awaited (ClusterWiring)."""
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

    def _had(self, cid: str, msg_id: str) -> bool:
        """The message was queued for (or sent to) the session here already, or by an owner before it."""
        seen = self._seen.get(cid)
        return seen is not None and msg_id in seen

    def _is_qos2(self, cid: str, packet_id: int | None) -> bool:
        """ClusterStore hook: the delivery in flight under packet_id is QoS2 (its SENT state is replicated)."""
        session = self.broker.sessions.get(cid) if self.broker is not None and self.r > 1 else None
        delivery = session.inflight.get(packet_id) if session is not None and packet_id is not None else None
        return delivery is not None and delivery.qos == 2

    def _note_enqueued(self, cid: str, delivery: Delivery) -> None:
        """ClusterStore hook: every durable enqueue (local routing, adoption, forwards)."""
        self._remember(cid, delivery.message.msg_id)


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
        one), the session starts here from its claim (_stand_in), from a replica copy of `old`'s if we or a peer hold
        one (chaos 90187), and the hand-over joins it if it comes later (late, not lost; before, it was taken for one
        already adopted here and its queue was dropped). Not a new session
        from the broker: without the claim's subscriptions the forwards buffered for `old`, retargeted into it,
        matched nothing and were dropped, and the client was told session present = 0 (chaos 70533, 89 lost)."""
        if self.svc.links.is_up(old):
            answer = await self._async_ask(old, cid, False)
            if answer is not None and answer[0] == FROM_OWNER:
                return ReasonCode.SUCCESS  # adopted when the state arrived
        offered: list[ReplicaCopy] = []
        claim = self.claims.get(cid)
        if claim is not None and self._stand_in_copy(cid, old, claim, []) is None:  # the replica may be a third node
            peers = [p for p in self.svc.links.up_peers() if p != old]
            answers = await asyncio.gather(*(self._async_ask(p, cid, False) for p in peers))
            offered = [decode_copy(a[1]) for a in answers if a is not None and a[0] == FROM_COPY]
        if self._awaited(cid) == old:
            self._stand_in(cid, old, offered)
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
            # The owner may have let it go to us with the hand-over cut off by the split: resent at the heal, it is
            # merged as a stand-in's (chaos 100453: taken for a resend under our newer claim, dropped: 59 lost).
            self._stand_ins[cid] = owner
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


    def _on_handover(self, peer: str, cid: str, data: bytes, clean: bool, waiting: bool) -> None:
        """The owner let a session go to us: adopt it now, in stream order, even if we gave up asking (it is gone
        there). If we gave up and hold the session already (resumed from a replica meanwhile), merge instead: what
        we lack of its queue joins ours, in order; replacing ours would drop what it queued since. If it moved on
        meanwhile (to a third node, or back to the sender), its owner gets what it lacks."""
        broker = self.broker
        assert broker is not None
        epoch, record, queue, qos2, seen = decode_handover(data)
        stand_in = self._stand_ins.get(cid) in (peer, "") and cid in broker.sessions  # started here without it
        # Resumed here from a copy of the sender's state after it made this hand-over (chaos 70930: the hand-over
        # was stuck on a dead link; its messages the copy lacked were dropped as a resend and lost): merged too.
        current = self.claims.get(cid)
        resumed = (current is not None and current.origin == FROM_REPLICA and peer in current.bases
                   and current.epoch > epoch and cid in broker.sessions)
        if self._adopted.get(cid) == epoch or (self._have_since(cid, epoch) and not stand_in and not resumed):
            return  # a resent hand-over we already have (adopted before a restart: the claim says so)
        if clean or record.expiry_interval == 0:
            return
        self._adopted[cid] = epoch
        claim = self.claims.get(cid)
        if (not waiting and cid not in broker.sessions and claim is not None and claim.epoch > epoch
                and claim.owner != self.node_id):
            # The session moved on while this hand-over waited for us (we died before confirming it): adopting it
            # would strand its queue here; what the current owner cannot have goes to it (it drops what it has by
            # id; not a RELEASED one, the client has it: after a start here from the claim nobody since knew its id,
            # chaos 80276). The owner may be the sender itself, the session back there since: adopted, the stale
            # copy made us take its next hand-over to us for a resend we had, and dropped it (chaos 100080).
            passed = [d for d in queue if d.state != DeliveryState.RELEASED and hands_over(claim, peer, d.seq)]
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
        # What the old owner acknowledged meanwhile (it passes those on behind this state) and then our forwards still
        # buffered for it join the session now, in order, before any newer local publish; copies it had are dropped.
        for message in self._take_awaited_acked(cid, peer):
            self._onward(message, self._deliver_here(message, (cid,)))
        self._retarget(cid, peer, self.node_id)

    def _stand_in(self, cid: str, old: str, offered: list[ReplicaCopy] | None = None) -> None:
        """Start a persistent session of ours here from its claim although its hand-over from `old` ("": unknown,
        after a restart) has not come: messages acknowledged for it must not be routed nowhere. If the hand-over
        turns up after all, what it holds joins the session (late, not lost: _on_handover)."""
        broker = self.broker
        assert broker is not None
        claim = self.claims[cid]
        copy = self._stand_in_copy(cid, old, claim, offered or [])
        log.warning("session %s: claimed here, no hand-over%s yet: started here from its claim%s", cid,
                    f" from {old}" if old else "", f" and a copy ({len(copy.queue)} queued)" if copy else "")
        if copy is not None:
            # A replica copy of the state `old` let go (ours: its OP_DROP had not come, chaos 90187, 15 lost): its
            # queue first, as a hand-over's; the late hand-over adds only what we lack (by message id).
            for msg_id in copy.seen:
                self._remember(cid, msg_id)
            copy.record.subscriptions = dict(claim.subscriptions)
            adopt_session(broker, copy.record, copy.deliveries(), sorted(copy.qos2))
            if copy is self.copies.get(cid):
                self._persist_copy(cid, None, Replicate(0, cid, OP_DROP, b""), True)
            # What `old` acknowledged for it while we awaited its hand-over (no longer in our buffer for it) comes
            # next, ahead of our forwards still buffered there; the copy's ids drop those `old` had queued, delivered
            # ones included. Left to `old`, they came with its late hand-over, behind newer ones (chaos 110025).
            for message in self._take_awaited_acked(cid, old):
                self._onward(message, self._deliver_here(message, (cid,)))
        else:
            record = SessionRecord(cid, 5, broker.settings.max_session_expiry,
                                   subscriptions=dict(claim.subscriptions))
            adopt_session(broker, record, [], [])
        self._stand_ins[cid] = old
        self._emit("migrated", subscriber=cid, reason="stand_in")
        self._retarget(cid, old, self.node_id)  # ends the awaiting; our forwards buffered for `old` join it, in order

    def _stand_in_copy(self, cid: str, old: str, claim: SessionClaim,
                       offered: list[ReplicaCopy]) -> ReplicaCopy | None:
        """The freshest replica copy (ours, or `offered` by peers) of the session `old` let go to us that is of that
        hand-over's lineage: owned by `old` under an older claim, and further than the state any earlier owner
        handed on (a copy `old` left behind when the session moved away from it before, its OP_DROP lost, is not)."""
        earlier = max([base for node, base in claim.bases.items() if node != old], default=0)
        local = self.copies.get(cid)
        fit = [c for c in ([local] if local is not None else []) + offered
               if old and c.owner == old and c.epoch < claim.epoch and queue_position(c) > earlier]
        return freshest(fit) if fit else None

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
