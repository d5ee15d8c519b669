"""Answering the takeover protocol: hand a session over (kept until confirmed), answer from copies, hold for resumes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appliance.broker.handover import release_session
from appliance.broker.model import Message
from appliance.cluster.ownership import (
    MIGRATED,
    Handing,
    ReplicaCopy,
    SessionClaim,
    decode_handover,
    encode_claim,
    encode_copy,
    encode_handing,
    encode_handover,
    extend_lineage,
    freshest,
)
from appliance.cluster.wire import Forward, Repair, SessionDone, SessionState, SessionTakeover

from .cluster_sessions import FROM_COPY, FROM_HANDOVER, FROM_OWNER, OWNER_UP, SESSIONS

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService
    from appliance.cluster.wire import ClusterMessage
    from appliance.store import SqliteStore

    from .cluster_store import ClusterStore

log = logging.getLogger("appliance.cluster")
RELEASED_PUSH_S = 300.0  # a session let go this recently has its claim pushed to every peer that links up
RESUME_HOLD_TIMEOUTS = 3  # failure_timeouts a resume we did not object to may take (the asker waits 2 for answers)
HANDING = "ho"  # KV namespace: client id -> a hand-over not confirmed by its taker (the session's only copy)


class HandoverAnswers:
    """Mixed into ClusterWiring: the old owner's and a third node's side of a takeover, and heal-time holds."""

    node_id: str
    c: dict[str, Any]
    broker: Broker | None
    inner: SqliteStore
    store: ClusterStore
    claims: dict[str, SessionClaim]
    copies: dict[str, ReplicaCopy]
    # client id -> (node taking it over, SessionState data, whether a third node may resume from it) until the taker's
    # SessionDone, which it sends once the session is durable there and on its replicas
    _handing: dict[str, Handing]
    _released: dict[str, float]  # client id -> when this node let the session go (its claim is pushed on link-up)
    _seen: dict[str, OrderedDict[str, None]]
    _resumes: dict[str, list[tuple[str, str, int, int]]]  # client id -> [(asker, owner, token, request)]
    _resume_acked: dict[str, list[tuple[str, Message]]]  # client id -> [(owner, message)] it acked during a hold
    _requests: dict[int, tuple[asyncio.Future[tuple[int, bytes] | None], str, bool]]
    _reconciled: asyncio.Event | None  # IngressGuard: set once a restarted node's restored state is reconciled
    _resend_due: dict[str, int]  # client id -> request id: a hand-over to resend once reconciled (0: at link-up)
    clock: Callable[[], float]
    _on_handover: Callable[[str, str, bytes, bool, bool], None]  # SessionMigration: adopt a session handed to us
    _kept_copies: dict[str, list[str]]  # QueueReplication: replicas keeping their copy until our hand-over is confirmed
    _drop_kept_copies: Callable[[str], None]  # QueueReplication: the taker confirmed, they drop it
    _awaited_acked: dict[str, tuple[str, list[Message]]]  # ClaimRouting: (that old owner, what it acked for it)

    @property
    def svc(self) -> ClusterService:
        """The running service (ClusterWiring)."""
        raise NotImplementedError

    def _emit(self, kind: str, **fields: Any) -> None:
        """Delivery-log event (ClusterWiring)."""
        raise NotImplementedError

    def _awaited(self, cid: str) -> str | None:
        """The old owner whose hand-over of a session of ours has not come yet (ClusterWiring)."""
        raise NotImplementedError

    # -- takeover answers ---------------------------------------------------------------------------------------
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
                # Our replicas keep their copy until the taker confirms: the hand-over may wait behind holds, and we
                # may die before it leaves (chaos 100334: the copy was dropped at once, the taker started empty).
                if not msg.clean_start and broker.sessions[cid].record.expiry_interval > 0:
                    self._kept_copies.setdefault(cid, [])
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
                if self._restoring():
                    self._resend_due[cid] = msg.request_id
                else:
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

    def _restoring(self) -> bool:
        """Restarted, with restored forwards and QoS2 tags not yet reconciled with the claims (IngressGuard)."""
        return self._reconciled is not None and not self._reconciled.is_set()

    def _reconcile_handing(self, drop_ids: set[str]) -> int:
        """A restart's reconciliation (before the streams are released): QoS2 messages that their publishers' resumed
        sessions took over (routed again under other ids, or passed on) leave our unconfirmed hand-overs as they
        left our forwards and queues, ids included (else a passed-on copy would be dropped as a repeat); then the
        hand-overs due go out, ahead of the forwards buffered for their takers. Before, the hand-over restored
        from disk still held them and its taker delivered them twice (chaos 80276). Return how many left."""
        purged = 0
        for cid, (taker, data, resumable) in list(self._handing.items()):
            epoch, record, queue, qos2, seen = decode_handover(data[1:])
            kept = [d for d in queue if d.message.msg_id not in drop_ids]
            if len(kept) != len(queue):
                purged += len(queue) - len(kept)
                handover = encode_handover(epoch, record, kept, qos2, [m for m in seen if m not in drop_ids])
                self._hand(cid, (taker, data[:1] + handover, resumable))
        due, self._resend_due = self._resend_due, {}
        for cid, request_id in due.items():
            taker, data, _resumable = self._handing.get(cid, ("", b"", False))
            if taker and self.svc.links.is_up(taker):  # else resent when it links up
                self.svc.send_behind_holds(taker, SessionState(request_id, cid, True, data), buffered=True)
        return purged

    def _hand(self, cid: str, entry: Handing) -> None:
        """Keep a hand-over until its taker confirms it, on disk too (written right after the session's deletion):
        with the answer lost on a dead link it is the session's only full copy (the replicas keep theirs until then,
        but a restart forgets to drop them), and this node may be killed and restarted before the link returns."""
        self._handing[cid] = entry
        self.inner.kv_put(HANDING, cid, encode_handing(entry))

    def _handed(self, cid: str) -> None:
        """The taker confirmed the hand-over (or it was superseded): forget it; our replicas drop their copy."""
        del self._handing[cid]
        self.inner.kv_delete(HANDING, cid)
        self._drop_kept_copies(cid)

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
        if clean_start or claim is None or not claim.persistent:
            return
        # Ours by claim, its hand-over awaited: the old owner routes the session for us, so it stands for the owner
        # (chaos 110899: what it had acknowledged and what was buffered for it reached the resume late).
        owner = claim.owner if claim.owner != self.node_id else self._awaited(cid) or ""
        if owner in (self.node_id, asker, ""):
            return
        token = self.svc.hold(owner, buffered=True)
        self._resumes.setdefault(cid, []).append((asker, owner, token, request_id))
        acked_by, kept = self._awaited_acked.get(cid, ("", []))
        if acked_by == owner:  # acknowledged before our answer (passed on behind its hand-over): they go first
            have = {message.msg_id for _owner, message in self._resume_acked.get(cid, [])}
            earlier = [(owner, message) for message in kept if message.msg_id not in have]
            self._resume_acked[cid] = earlier + self._resume_acked.get(cid, [])
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


    def _resend_handovers(self, peer: str) -> None:
        """A link to `peer` is up: hand-overs it has not confirmed go out again (it adopts each one once), and the
        claims of sessions we let go lately, before any ack of the peer's resent forwards: a sender that learnt the
        new owner only after our acks would send newer messages to it ahead of the ones we pass on (reordering).
        A hand-over that waits behind holds keeps the forwards buffered for the peer back too: those followed the
        lost one; resent at once, they overtook it and the taker queued the hand-over's older messages behind them
        (chaos seed 80026)."""
        for cid, (taker, data, _resumable) in list(self._handing.items()):
            if taker == peer and self._restoring():
                self._resend_due.setdefault(cid, 0)
            elif taker == peer:
                self.svc.send_behind_holds(peer, SessionState(0, cid, True, data), buffered=True)
        horizon = time.monotonic() - RELEASED_PUSH_S
        for cid, at in list(self._released.items()):
            if at < horizon:
                del self._released[cid]
        if self._released:
            clocks = self.svc.spaces[SESSIONS].clocks_for(self._released)
            if clocks:
                self.svc.send(peer, Repair(SESSIONS, clocks))
