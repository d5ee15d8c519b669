"""Replicated spaces applied on a node: retained messages, and session claims (routing, hand-overs, moved queues)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from appliance.broker.handover import release_session, session_image
from appliance.broker.model import DeliveryState, Message
from appliance.broker.topictree import TopicTree
from appliance.cluster import dvv
from appliance.cluster.ownership import Handing, SessionClaim, claim_order, decode_claim, decode_handover, hands_over
from appliance.cluster.records import decode_retained, retained_order
from appliance.cluster.wire import Forward, encode

from .cluster_sessions import seq_key

if TYPE_CHECKING:
    from appliance.broker.broker import Broker
    from appliance.cluster.service import ClusterService
    from appliance.store import SqliteStore

    from .cluster_store import ClusterStore, Wait

log = logging.getLogger("appliance.cluster")
SESSIONS, RETAINED = "sessions", "retained"


class ClaimRouting:
    """Mixed into ClusterWiring (before SessionMigration, whose declarations of _awaited / _retarget it implements)."""

    node_id: str
    broker: Broker | None
    inner: SqliteStore
    store: ClusterStore
    remote_tree: TopicTree
    claims: dict[str, SessionClaim]
    _seen: dict[str, OrderedDict[str, None]]
    _awaiting: dict[str, str]  # client id -> old owner whose hand-over we await (claim ours, no session)
    _awaited_acked: dict[str, tuple[str, list[Message]]]  # client id -> (that old owner, what it acked for it)
    _stand_ins: dict[str, str]
    _released: dict[str, float]
    _resumes: dict[str, list[tuple[str, str, int, int]]]
    _end_resume_holds: Callable[..., bool]  # HandoverAnswers: release heal-time holds of a session
    _take_acked_during_hold: Callable[[str, str], list[Message]]  # HandoverAnswers: acked by `old` during a hold
    _unstrand: Callable[[str, int], None]  # IngressGuard: a forward no longer stranded
    _handing: dict[str, Handing]  # client id -> our unconfirmed hand-over (HandoverAnswers)
    _handed: Callable[[str], None]  # HandoverAnswers: forget a hand-over

    @property
    def svc(self) -> ClusterService:
        """The running service (ClusterWiring)."""
        raise NotImplementedError

    def _emit(self, kind: str, **fields: Any) -> None:
        """Delivery-log event (ClusterWiring)."""
        raise NotImplementedError

    def _forward(self, node: str, message: Message, clients: tuple[str, ...]) -> list[Wait]:
        """Durably buffer and send one Forward; the waits it registered (ClusterWiring)."""
        raise NotImplementedError

    def _deliver_here(self, message: Message, clients: tuple[str, ...]) -> list[str]:
        """Deliver a forwarded message to local sessions that lack it (ClusterWiring)."""
        raise NotImplementedError

    def _onward(self, message: Message, clients: list[str]) -> None:
        """Forward a message to the owners of clients not here (ClusterWiring)."""
        raise NotImplementedError

    # -- replicated spaces ---------------------------------------------------------------------------------------
    def _on_replicated(self, space: str, key: str, clock: dvv.DVVSet | None) -> None:
        """Persist a changed clock with the space counter, and apply the resolved value to the broker."""
        if clock is None:
            self.inner.kv_delete(f"dvv/{space}", key)
        else:
            self.inner.kv_put(f"dvv/{space}", key, dvv.encode(clock))
        self.inner.set_meta(f"cluster.counter.{space}", str(self.svc.spaces[space].counter))
        if space == RETAINED:
            self._apply_retained(key, dvv.resolve(clock, retained_order) if clock is not None else None)
        elif space == SESSIONS:
            value = dvv.resolve(clock, claim_order) if clock is not None else None
            claim = decode_claim(value) if value is not None else None
            self._apply_claim(key, claim)
            if key in self._resumes:  # a resume we did not object to: held forwards were retargeted just now
                self._end_resume_holds(key, owner=claim.owner if claim is not None else "")

    def _apply_retained(self, topic: str, value: bytes | None) -> None:
        broker = self.broker
        if broker is None:
            return
        current = broker.router.retained.get(topic)
        if value is None:
            if current is not None:
                del broker.router.retained[topic]
                self.store.delete_retained(topic)
            return
        message = decode_retained(value)
        if current is None or current.msg_id != message.msg_id:
            broker.router.retained[topic] = message
            self.store.save_retained(message)

    def _apply_claim(self, cid: str, claim: SessionClaim | None, restoring: bool = False) -> None:
        """Route by the winning claim; a node that lost its claim closes the client (0x8E) and hands over."""
        old = self.claims.get(cid)
        awaited = self._end_awaiting(cid)
        if old is not None and old.owner != self.node_id:
            for topic_filter in old.subscriptions:
                self.remote_tree.remove(cid, topic_filter)
        if claim is None or claim.owner != self.node_id:
            self._stand_ins.pop(cid, None)
            self._awaited_acked.pop(cid, None)  # the old owner passes them on to the new one
        if claim is None:
            self.claims.pop(cid, None)
            return
        self.claims[cid] = claim
        if claim.owner == self.node_id:
            if not restoring and old is not None and old.owner != self.node_id:
                self._retarget(cid, old.owner, self.node_id)  # our buffered forwards to its old node: deliver here
                awaited = old.owner
            if not restoring and awaited is not None:
                self._await_handover(cid, claim, awaited)
            return
        for topic_filter, options in claim.subscriptions.items():
            self.remote_tree.add(cid, topic_filter, options)
        if restoring:
            return
        broker = self.broker
        if broker is not None and cid in broker.sessions:
            self._lose(cid, claim)
        self._pass_on_superseded(cid, claim)
        if old is not None and old.owner != claim.owner:
            self._retarget(cid, old.owner, claim.owner)
        if awaited is not None and awaited != claim.owner and any(e[1] == awaited for e in self._resumes.get(cid, ())):
            # A resume we held for while we awaited `awaited`'s hand-over (_hold_for_resume): what we kept for it
            # follows the claim, in order, before anything newer (chaos 110899)
            self._retarget(cid, awaited, claim.owner)

    def _pass_on_superseded(self, cid: str, claim: SessionClaim) -> None:
        """A newer claim of another node than our unconfirmed hand-over's taker (it resumed from a copy, or started
        from its claim, without it): what its lineage lacks of that hand-over goes to it now, ahead of the forwards we
        retarget and of anything newer; resent to the taker, it reached the owner behind them (chaos 100302)."""
        taker, data, _resumable = self._handing.get(cid, ("", b"", False))
        if not taker or taker == claim.owner or claim.owner == self.node_id:
            return
        epoch, _record, queue, _qos2, _seen = decode_handover(data[1:])
        if claim.epoch <= epoch:
            return
        for delivery in queue:  # not a RELEASED one: the client has it (chaos 100210)
            if delivery.state != DeliveryState.RELEASED and hands_over(claim, self.node_id, delivery.seq):
                self._forward(claim.owner, delivery.message, (cid,))
        self._handed(cid)

    def _await_handover(self, cid: str, claim: SessionClaim, old: str) -> None:
        """Our claim arrived before the session (chaos seed 30318: relayed by a third node while the old owner's
        hand-over was lost with its link): until the hand-over is adopted, the session's messages go to the old
        owner, which passes them on after it; adopting it takes those still buffered into the session, in order.
        Routed nowhere (the claim says "here", no session here), they were acknowledged and lost. If the session
        started here meanwhile (a CONNECT), those still buffered for the old owner join it now."""
        broker = self.broker
        if broker is not None and cid in broker.sessions:
            self._retarget(cid, old, self.node_id)
            return
        if not claim.persistent or broker is None:
            return
        self._awaiting[cid] = old
        for topic_filter, options in claim.subscriptions.items():
            self.remote_tree.add(cid, topic_filter, options)

    def _awaited(self, cid: str) -> str | None:
        """The old owner that routes a session of ours for us while its hand-over has not been adopted here."""
        node = self._awaiting.get(cid)
        return node if node is not None and (self.broker is None or cid not in self.broker.sessions) else None

    def _acked_while_awaited(self, peer: str, released: list[Forward]) -> None:
        """`peer` acknowledged forwards for a session whose hand-over from it we await: it passes them on only behind
        that hand-over (read after it let the session go, or answered as duplicates at a link-up while its resent
        hand-over waited behind holds), so after the newer ones we still buffer for it, which join the session at
        the adoption (chaos 90119, reordered). Kept, they join it first (_take_awaited_acked); the pass-on is
        dropped by message id."""
        for fwd in released:
            for cid in fwd.clients:
                if self._awaited(cid) == peer:
                    old, kept = self._awaited_acked.setdefault(cid, (peer, []))
                    if old == peer:
                        kept.append(fwd.message)

    def _take_awaited_acked(self, cid: str, old: str) -> list[Message]:
        """What `old` acknowledged for `cid` while we awaited its hand-over, oldest first (now adopted here)."""
        kept = self._awaited_acked.pop(cid, None)
        return kept[1] if kept is not None and kept[0] == old else []

    def _end_awaiting(self, cid: str) -> str | None:
        """Stop routing a session through its old owner (adopted, or the claim changed); return that node."""
        node = self._awaiting.pop(cid, None)
        claim = self.claims.get(cid)
        if node is not None and claim is not None:
            for topic_filter in claim.subscriptions:
                self.remote_tree.remove(cid, topic_filter)
        return node

    def _lose(self, cid: str, claim: SessionClaim) -> None:
        """Another node's claim won: our connection gets 0x8E; messages it cannot have are handed to it (not a
        RELEASED one: the client has it; a winner started from its claim would send it again as new, chaos 100210)."""
        broker = self.broker
        assert broker is not None
        image = session_image(broker, cid)
        log.info("session %s now owned by %s: closing it here", cid, claim.owner)
        self._released[cid] = time.monotonic()
        if image is not None:
            for delivery in image[1]:
                # The winner dedupes by message id, but one started from its claim knows none of ours.
                if delivery.state != DeliveryState.RELEASED and hands_over(claim, self.node_id, delivery.seq):
                    self._forward(claim.owner, delivery.message, (cid,))
        release_session(broker, cid, clean_start=False)
        # The ids go with the session (the winner dedupes by its own memory): kept here, a forward handed to a winner
        # that died, then retargeted into the session resumed here from a copy, was dropped as a second copy (chaos
        # 40042, 185 acknowledged messages lost).
        self._seen.pop(cid, None)
        self._emit("migrated", subscriber=cid, peer_node=claim.owner, reason="claim_lost")

    def _retarget(self, cid: str, old: str, new: str) -> None:
        """Buffered forwards for a subscriber that moved follow it to its new node, in order; a forward that names
        other clients of the old node too stays in that stream for them, narrowed (a detour would reorder it)."""
        if old == self.node_id:
            return
        if new == self.node_id:
            if self.broker is None or cid not in self.broker.sessions:
                return  # the hand-over has not arrived yet: the old node passes these on after it, in order
            self._end_awaiting(cid)
            # Not taken by an adoption or a start from a copy (_take_awaited_acked): a stand-in start without a copy,
            # whose hand-over's ids are not known (one the old owner had delivered would be sent again): they come
            # late, passed on.
            self._awaited_acked.pop(cid, None)
        acked = self._take_acked_during_hold(cid, old)  # older than those still buffered: they go first
        for message in acked:
            if new == self.node_id:
                self._onward(message, self._deliver_here(message, (cid,)))
            else:
                self._forward(new, message, (cid,))
        sender = self.svc.senders.get(old)
        moving = [f for f in sender.resend() if cid in f.clients] if sender is not None else []
        if moving or acked:
            log.info("session %s moved %s -> %s: %d buffered forwards follow it", cid, old, new,
                     len(acked) + len(moving))
        if sender is None:
            return
        for buffered in moving:
            waiters: list[Any] = []
            if set(buffered.clients) == {cid}:
                [(fwd, waiters)] = sender.retarget([buffered.seq])
                self._unstrand(old, fwd.seq)
                if fwd.message.qos:
                    self.inner.kv_delete(f"fwd/{old}", seq_key(fwd.seq))
            else:
                narrowed = sender.narrow(buffered.seq, cid)
                assert narrowed is not None
                fwd = narrowed
                if fwd.message.qos:
                    self.inner.kv_put(f"fwd/{old}", seq_key(fwd.seq), encode(fwd))
            if new == self.node_id:
                tracked = self.store.track()
                self._onward(fwd.message, self._deliver_here(fwd.message, (cid,)))
                self.store.untrack(tracked)
            else:
                tracked = self._forward(new, fwd.message, (cid,))
            for wait in tracked:  # what waited for it (a PUBREC, a pending QoS2 entry's release) waits for these
                self.store.chain_wait((old, fwd.seq, "f"), wait)
            for waiter in waiters:
                self.inner.after_commit(waiter, fwd.seq, 0)
