"""Session hand-over between cluster nodes and delivery of forwarded messages: broker rules, no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .model import Delivery, DeliveryState, Message, SessionRecord
from .router import Router
from .session import Session
from .settings import NEVER_EXPIRES

if TYPE_CHECKING:
    from .broker import Broker

SessionImage = tuple[SessionRecord, list[Delivery], list[int]]  # record (with subscriptions), queue, QoS2 packet ids


def session_image(broker: Broker, client_id: str) -> SessionImage | None:
    """A copy of a local session's state: inflight first (send order), then the waiting queue."""
    session = broker.sessions.get(client_id)
    if session is None:
        return None
    queue = sorted([*session.inflight.values(), *session.queue], key=lambda d: d.seq)
    return session.record, queue, sorted(session.incoming_qos2)


def release_session(broker: Broker, client_id: str, clean_start: bool) -> SessionImage | None:
    """Another node takes the session over: DISCONNECT 0x8E to a live connection here [MQTT-3.1.4-3], then hand
    the session's state over and forget it here (its disk image is deleted in the same commit order)."""
    session = broker.sessions.get(client_id)
    if session is None:
        return None
    if session.link is not None or session.connecting is not None:
        broker._take_over(session, clean_start)  # the will rules of a local takeover apply
    image = session_image(broker, client_id)
    for topic_filter in list(session.record.subscriptions):
        broker.router.tree.remove(client_id, topic_filter)
    del broker.sessions[client_id]
    broker._expiring.discard(client_id)
    broker._pending_wills.pop(client_id, None)
    if session.store is not None or session.record.expiry_interval > 0:
        broker.store.delete_session(client_id)
    session.store = None  # late acks for the old connection must not write the dropped session again
    return image


def adopt_session(broker: Broker, record: SessionRecord, queue: list[Delivery], qos2: list[int]) -> Session:
    """Install a session handed over (or recovered from a replica) as an offline session of this node, durably."""
    old = broker.sessions.get(record.client_id)
    if old is not None:
        release_session(broker, record.client_id, clean_start=False)
    persistent = record.expiry_interval > 0
    session = Session(record, broker.store if persistent else None, broker.clock, broker.events)
    broker.sessions[record.client_id] = session
    for topic_filter, options in record.subscriptions.items():
        broker.router.tree.add(record.client_id, topic_filter, options)
    now = broker.clock()
    if record.disconnected_at is None:
        record.disconnected_at = now
    record.next_seq = max([record.next_seq, *(d.seq + 1 for d in queue)])
    for delivery in queue:
        if delivery.state == DeliveryState.QUEUED or delivery.packet_id is None:
            delivery.state = DeliveryState.QUEUED
            delivery.packet_id = None
            session.queue.append(delivery)
        else:
            session.inflight[delivery.packet_id] = delivery
    for packet_id in qos2:
        session.incoming_qos2[packet_id] = None
    if persistent:
        broker.store.save_session(record)
        for topic_filter, options in record.subscriptions.items():
            broker.store.save_subscription(record.client_id, topic_filter, options)
        for delivery in queue:
            broker.store.enqueue(record.client_id, delivery)
        for packet_id in qos2:
            broker.store.save_incoming_qos2(record.client_id, packet_id, None)
        if record.expiry_interval != NEVER_EXPIRES:
            session.expires_at = record.disconnected_at + record.expiry_interval
            broker._expiring.add(record.client_id)
    return session


def deliver_forwarded(broker: Broker, message: Message, clients: tuple[str, ...]) -> list[str]:
    """Deliver a message another node forwarded to the named local sessions (their subscriptions decide QoS, retain
    flag and identifiers); returns the clients that took it (queued it, or were sent it at QoS 0)."""
    wanted = set(clients)
    targets: dict[str, tuple[int, bool, list[int], str]] = {}
    match = broker.router.tree.match(message.topic)
    for client_id, topic_filter, options in match.subscribers:
        if client_id in wanted and not (options.no_local and client_id == message.publisher):
            Router._aggregate(targets, client_id, topic_filter, options, message)
    for _group, topic_filter, members in match.shared:
        for client_id, options in members.items():
            if client_id in wanted and client_id not in targets:
                Router._aggregate(targets, client_id, topic_filter, options, message)
    took = []
    for client_id, (qos, retain, sub_ids, topic_filter) in targets.items():
        session = broker.sessions.get(client_id)
        if session is None:
            continue
        before = session.record.next_seq  # a queued delivery takes the next seq; a dropped one none
        online = qos == 0 and session.link is not None
        broker.router.deliver(session, message, qos, retain, sub_ids, topic_filter)
        if online or session.record.next_seq != before:
            took.append(client_id)
    return took

