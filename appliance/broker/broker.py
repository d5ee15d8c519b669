"""The broker rules: CONNECT/takeover, session lifecycle, publish and acknowledgement flows, wills, expiry."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from appliance.protocol.packets import (
    MQTT_5,
    NO_PROPERTIES,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    Will,
)
from appliance.protocol.reason_codes import ReasonCode
from appliance.protocol.topics import validate_topic_filter

from .acl import READ, WRITE, Acl
from .metrics import Metrics
from .model import DeliveryState, Message, SessionRecord, SubscriptionOptions
from .ports import ClusterPort, EventSink, Snapshot, Store
from .router import Router
from .session import ClientLink, Session
from .settings import NEVER_EXPIRES, BrokerSettings
from .topictree import split_shared

Ack = Puback | Pubrec | Pubcomp | Suback | Unsuback


class BrokerError(Exception):
    """A client broke a rule that ends its connection; `reason_code` goes into the DISCONNECT."""

    def __init__(self, message: str, reason_code: ReasonCode) -> None:
        super().__init__(message)
        self.reason_code = reason_code


_SUCCESS, _NO_MATCHING = ReasonCode.SUCCESS, ReasonCode.NO_MATCHING_SUBSCRIBERS  # globals: enum lookups are slow


def publication_properties(props: Properties) -> Properties:
    """The properties forwarded with a message: without Topic Alias and Subscription Identifiers [MQTT-3.3.4-6]."""
    if props.topic_alias is None and not props.subscription_identifiers:
        return props
    return replace(props, topic_alias=None, subscription_identifiers=[])


class Broker:
    """All broker state of one node; the server wiring feeds it packets and connection events."""

    def __init__(
        self,
        settings: BrokerSettings,
        store: Store,
        *,
        clock: Callable[[], float],
        events: EventSink | None = None,
        acl: Acl | None = None,
        cluster: ClusterPort | None = None,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.store = store
        self.clock = clock
        self.events = events
        self.acl = acl or Acl()
        self.metrics = Metrics()
        self.sessions: dict[str, Session] = {}
        self.router = Router(settings, self.sessions, store, events, self.metrics, clock)
        self.online = 0
        self._pending_wills: dict[str, tuple[float, Will, str | None]] = {}  # client id -> (due, will, username)
        self._expiring: set[str] = set()  # offline sessions with a finite expiry
        self._msg_prefix = f"{settings.node_id}-{int(clock() * 1000):x}-"
        self._msg_counter = 0
        self._handlers: dict[type, Callable[[Session, ClientLink, Any], None]] = {
            Publish: self._on_publish,
            Puback: self._on_puback,
            Pubrec: self._on_pubrec,
            Pubrel: self._on_pubrel,
            Pubcomp: self._on_puback,
            Subscribe: self._on_subscribe,
            Unsubscribe: self._on_unsubscribe,
            Pingreq: self._on_pingreq,
            Disconnect: self._on_disconnect,
        }

    # -- start-up ------------------------------------------------------------------------------------------------
    def restore(self, snapshot: Snapshot) -> None:
        """Rebuild sessions, subscriptions, queues, inflight and QoS2 state from the store [recovery]."""
        now = self.clock()
        self.router.retained.update(snapshot.retained)
        orphaned_wills: list[tuple[Session, Will]] = []  # published once every subscriber is back
        for client_id, record in snapshot.sessions.items():
            session = Session(record, self.store, self.clock, self.events)
            self.sessions[client_id] = session
            for topic_filter, options in record.subscriptions.items():
                self.router.tree.add(client_id, topic_filter, options)
            for delivery in snapshot.queues.get(client_id, []):
                if delivery.state == DeliveryState.QUEUED or delivery.packet_id is None:
                    delivery.state = DeliveryState.QUEUED
                    session.queue.append(delivery)
                else:
                    session.inflight[delivery.packet_id] = delivery
            session.incoming_qos2.update(snapshot.incoming_qos2.get(client_id, {}))
            if record.disconnected_at is None:  # the node died while the client was connected
                record.disconnected_at = now
                if record.will is not None:
                    orphaned_wills.append((session, record.will))
                self.store.save_session(record)
            elif record.will is not None and record.will_due_at is not None:
                self._pending_wills[client_id] = (record.will_due_at, record.will, record.username)
            if record.expiry_interval != NEVER_EXPIRES:
                session.expires_at = record.disconnected_at + record.expiry_interval
                self._expiring.add(client_id)
        for session, will in orphaned_wills:
            session.record.will = None  # published now, or kept again with its due time when delayed
            self._schedule_will(session, will, now)
            self.store.save_session(session.record)

    def new_message_id(self) -> str:
        """A cluster-unique message id: node, start time and a counter."""
        self._msg_counter += 1
        return f"{self._msg_prefix}{self._msg_counter}"

    # -- connection lifecycle ------------------------------------------------------------------------------------
    def connect(self, link: ClientLink, packet: Connect, auth: ReasonCode) -> Session | None:
        """Handle an authenticated-or-not CONNECT; returns the session, or None after a refusing CONNACK."""
        settings = self.settings
        v5 = packet.protocol_version == MQTT_5
        if auth != ReasonCode.SUCCESS:
            self._refuse(link, auth, "auth")
            return None
        if self.online >= settings.max_connections:
            self._refuse(link, ReasonCode.QUOTA_EXCEEDED if v5 else ReasonCode.SERVER_UNAVAILABLE, "limit")
            return None
        if packet.properties.authentication_method is not None:
            self._refuse(link, ReasonCode.BAD_AUTHENTICATION_METHOD, "auth_method")
            return None
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if not v5 and not packet.clean_start:  # [MQTT-3.1.3-8]
                self._refuse(link, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client_id")
                return None
            client_id = assigned = f"auto-{uuid.uuid4().hex}"  # [MQTT-3.1.3-6]
        if v5:
            expiry = packet.properties.session_expiry_interval or 0
        else:
            expiry = 0 if packet.clean_start else settings.v311_persistent_session_expiry
        expiry = min(expiry, settings.max_session_expiry)
        now = self.clock()
        self.metrics.connects += 1

        old = self.sessions.get(client_id)
        if old is not None:
            self._take_over(old, packet.clean_start)
        pending = self._pending_wills.pop(client_id, None)
        if pending is not None and packet.clean_start:  # the old session ends now [MQTT-3.1.3-9]
            self._publish_will(client_id, pending[1], pending[2])
        if old is not None and packet.clean_start:
            self._destroy(old, "clean_start")
            old = None
        session_present = old is not None
        if old is None:
            record = SessionRecord(client_id, packet.protocol_version, expiry)
            session = Session(record, None, self.clock, self.events)
            self.sessions[client_id] = session
        else:
            session = old
            record = session.record
            record.protocol_version = packet.protocol_version
            if record.expiry_interval > 0 and expiry == 0:
                self.store.delete_session(client_id)  # no longer persistent: its disk image goes now
            record.expiry_interval = expiry
        record.username = packet.username
        record.will = packet.will
        record.will_due_at = None
        record.disconnected_at = None
        session.store = self.store if expiry > 0 else None
        session.expires_at = None
        self._expiring.discard(client_id)
        client_max = packet.properties.receive_maximum if v5 else None
        session.receive_maximum = min(client_max or 65535, settings.max_inflight)
        session.connected_at = now
        session.connecting = link
        self.online += 1

        props = settings.connack_properties(assigned, expiry, packet) if v5 else Properties()
        connack = Connack(session_present, ReasonCode.SUCCESS, props)
        if self.cluster is not None:
            self.cluster.session_changed(record, connected=True)  # this node now owns the session cluster-wide
        if session.store is not None:
            self.store.save_session(record)
            self.store.after_commit(self._accept, session, link, connack)
        else:
            self._accept(session, link, connack)
        return session

    def _refuse(self, link: ClientLink, code: ReasonCode, why: str) -> None:
        self.metrics.connects_refused[why] += 1
        link.send(Connack(False, code))  # [MQTT-3.2.2-6]: session present is 0 on refusal
        link.close(None)

    def _accept(self, session: Session, link: ClientLink, connack: Connack) -> None:
        """CONNACK goes out once the session is durable; then inflight is resent and the queue drained in order."""
        if session.connecting is not link:
            return  # this connection was taken over or closed meanwhile
        session.connecting = None
        link.send(connack)
        session.link = link
        session.resend_inflight()
        session.pump()

    def _take_over(self, old: Session, clean_start: bool) -> None:
        """A second CONNECT with the same client id: the old connection gets DISCONNECT 0x8E [MQTT-3.1.4-3]."""
        old_link = old.link or old.connecting
        if old_link is None:
            return
        self.metrics.takeovers += 1
        if self.events is not None:
            self.events.emit("takeover", subscriber=old.client_id, reason="session_taken_over")
        will = old.record.will
        old.link = old.connecting = None
        self.online -= 1
        old_link.close(ReasonCode.SESSION_TAKEN_OVER)
        if will is not None and (clean_start or not old.persistent or not (will.properties.will_delay_interval or 0)):
            self._publish_will(old.client_id, will, old.record.username)
        old.record.will = None

    def connection_lost(self, session: Session, link: ClientLink) -> None:
        """The network connection closed without DISCONNECT (or after a server-side close): will and expiry apply."""
        if session.link is link or session.connecting is link:
            self._disconnected(session, publish_will=True)

    def _disconnected(self, session: Session, publish_will: bool) -> None:
        session.link = session.connecting = None
        self.online -= 1
        now = self.clock()
        record = session.record
        will = record.will
        record.will = None
        if will is not None and publish_will:
            self._schedule_will(session, will, now)
        if not session.persistent:
            self._destroy(session, "session_ended")
            return
        record.disconnected_at = now
        if record.expiry_interval != NEVER_EXPIRES:
            session.expires_at = now + record.expiry_interval
            self._expiring.add(session.client_id)
        self.store.save_session(record)

    def _schedule_will(self, session: Session, will: Will, now: float) -> None:
        delay = will.properties.will_delay_interval or 0
        if delay == 0 or not session.persistent:
            self._publish_will(session.client_id, will, session.record.username)
            return
        due = now + min(delay, session.record.expiry_interval)  # will delay or session end, whichever first
        self._pending_wills[session.client_id] = (due, will, session.record.username)
        session.record.will = will
        session.record.will_due_at = due

    def _publish_will(self, client_id: str, will: Will, username: str | None) -> None:
        if not self.acl.allowed(WRITE, username, client_id, will.topic):
            self.metrics.drop("acl")
            return
        props = replace(will.properties, will_delay_interval=None)
        self.metrics.wills_published += 1
        self.inject(will.topic, will.payload, will.qos, will.retain, client_id, props)

    def _destroy(self, session: Session, reason: str) -> None:
        client_id = session.client_id
        for topic_filter in list(session.record.subscriptions):
            self.router.tree.remove(client_id, topic_filter)
        if self.sessions.get(client_id) is session:
            del self.sessions[client_id]
            if self.cluster is not None:
                self.cluster.session_removed(client_id)
        self._expiring.discard(client_id)
        lost = session.queued_count()
        if lost:
            self.metrics.drop(reason, lost)
        if session.store is not None or session.record.expiry_interval > 0:
            self.store.delete_session(client_id)

    # -- timers --------------------------------------------------------------------------------------------------
    def tick(self) -> None:
        """Fire due delayed wills and end expired sessions [MQTT-3.1.2-23, 3.1.3-9]; call about once a second."""
        now = self.clock()
        for client_id, (due, will, username) in list(self._pending_wills.items()):
            if due <= now:
                del self._pending_wills[client_id]
                self._publish_will(client_id, will, username)
                session = self.sessions.get(client_id)
                if session is not None and session.record.will is will:
                    session.record.will = None
                    session.record.will_due_at = None
                    self.store.save_session(session.record)
        for client_id in list(self._expiring):
            session = self.sessions.get(client_id)
            if session is None or session.online or session.connecting is not None:
                self._expiring.discard(client_id)
            elif session.expires_at is not None and session.expires_at <= now:
                self.metrics.sessions_expired += 1
                self._destroy(session, "session_expired")

    # -- packets -------------------------------------------------------------------------------------------------
    def handle(self, session: Session, link: ClientLink, packet: Packet) -> None:
        """Apply one packet from a connected client; raises BrokerError when the connection must end."""
        handler = self._handlers.get(type(packet))
        if handler is None:
            raise BrokerError(f"unexpected {type(packet).__name__}", ReasonCode.PROTOCOL_ERROR)
        handler(session, link, packet)

    def _on_pingreq(self, session: Session, link: ClientLink, packet: Pingreq) -> None:
        link.send(Pingresp())

    def _ack(self, session: Session, link: ClientLink, ack: Ack, durable: bool) -> None:
        """Send an acknowledgement after the commit that makes it true, keeping acks in order [MQTT-4.6.0-2]."""
        if durable or session.pending_acks:
            session.pending_acks += 1
            self.store.after_commit(self._send_ack, session, link, ack)
        else:
            link.send(ack)

    @staticmethod
    def _send_ack(session: Session, link: ClientLink, ack: Ack) -> None:
        session.pending_acks -= 1
        link.send(ack)

    def _on_publish(self, session: Session, link: ClientLink, packet: Publish) -> None:
        qos = packet.qos
        settings = self.settings
        self.metrics.messages_in[qos] += 1
        v5 = link.protocol_version == MQTT_5
        if qos > settings.maximum_qos:
            raise BrokerError("QoS above Maximum QoS", ReasonCode.QOS_NOT_SUPPORTED)  # [MQTT-3.2.2-11]
        if packet.retain and not settings.retain_available:
            raise BrokerError("retain not available", ReasonCode.RETAIN_NOT_SUPPORTED)  # [MQTT-3.2.2-14]
        pid = packet.packet_id
        if qos == 2 and pid in session.incoming_qos2:  # a resent QoS2 PUBLISH: never routed twice [MQTT-4.3.3-?]
            self._ack(session, link, Pubrec(pid), False)
            return
        record = session.record
        topic = packet.topic
        acl = self.acl
        if topic.startswith("$") or (acl.enabled and not acl.allowed(WRITE, record.username, record.client_id, topic)):
            self.metrics.drop("acl")
            if self.events is not None:
                self.events.emit("dropped", topic=topic, publisher=record.client_id, reason="acl")
            if qos:
                code = ReasonCode.NOT_AUTHORIZED if v5 else ReasonCode.SUCCESS
                self._ack(session, link, Puback(pid, code) if qos == 1 else Pubrec(pid, code), False)  # type: ignore[arg-type]
            return
        props = packet.properties
        now = self.clock()
        expiry = props.message_expiry_interval
        message = Message(
            self.new_message_id(), topic, packet.payload, qos, packet.retain, record.client_id, now,
            now + expiry if expiry is not None else None,
            props if props is NO_PROPERTIES else publication_properties(props),
        )
        cluster = self.cluster
        refusal = cluster.publish_refusal(message) if cluster is not None and qos else None
        if refusal is not None:  # netsplit / under-replication policy: no ack that the cluster cannot keep
            self.metrics.drop("cluster_refused")
            if not v5:
                raise BrokerError("publish refused by the cluster policy", ReasonCode(refusal))
            self._ack(session, link, Puback(pid, refusal) if qos == 1 else Pubrec(pid, refusal), False)  # type: ignore[arg-type]
            return
        if qos and settings.queue_full_policy == "refuse" and self.router.queue_full_for(message):
            self.metrics.drop("queue_full_refused")
            code = ReasonCode.QUOTA_EXCEEDED if v5 else ReasonCode.SUCCESS
            self._ack(session, link, Puback(pid, code) if qos == 1 else Pubrec(pid, code), False)  # type: ignore[arg-type]
            return
        events = self.events
        if events is not None:
            events.record_received(message.msg_id, record.client_id, topic, qos, packet.retain, len(packet.payload),
                                   props.user_properties or None, pid)
        qos2_saved = False
        if qos == 2:  # the id first: a cluster node's replica learns it before any node can act on the message
            session.incoming_qos2[pid] = None  # type: ignore[index]
            if session.store is not None:
                self.store.save_incoming_qos2(record.client_id, pid, None)  # type: ignore[arg-type]
                qos2_saved = True
                if cluster is not None:
                    cluster.qos2_received(message)
        persisted = (packet.retain and self.router.retain(message)) or qos2_saved
        if cluster is None:
            reached, persisted_here, _ = self.router.route(message)
            persisted = persisted or persisted_here
        else:
            reached, persisted_here, chosen = self.router.route(message, cluster.remote_shared(topic))
            remote = cluster.route_remote(message, chosen)  # also replicates a retained message (or its clearing)
            reached, persisted = reached + remote, persisted or persisted_here or bool(remote)
        if qos == 0:
            return
        code = _NO_MATCHING if v5 and not reached else _SUCCESS
        ack = Puback(pid, code, NO_PROPERTIES) if qos == 1 else Pubrec(pid, code, NO_PROPERTIES)  # type: ignore[arg-type]
        if persisted and events is not None:  # one callback after the commit: the event, then the ack
            session.pending_acks += 1
            self.store.after_commit(self._committed, message, session, link, ack)
        else:
            self._ack(session, link, ack, persisted)

    def _committed(self, message: Message, session: Session, link: ClientLink, ack: Ack) -> None:
        if self.events is not None:
            self.events.record_committed(message.msg_id)
        self._send_ack(session, link, ack)

    def _on_puback(self, session: Session, link: ClientLink, packet: Puback | Pubcomp) -> None:
        delivery = session.complete(packet.packet_id)
        if delivery is not None:
            self.metrics.messages_out[delivery.qos] += 1
            if self.events is not None:
                self.events.record_acked(delivery.message.msg_id, session.client_id, delivery.qos)

    def _on_pubrec(self, session: Session, link: ClientLink, packet: Pubrec) -> None:
        if packet.reason_code >= 0x80:  # the client refused it: the flow ends here [MQTT-4.3.3-?]
            session.complete(packet.packet_id)
            return
        delivery = session.released(packet.packet_id)
        if delivery is None:
            link.send(Pubrel(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
            return
        if self.events is not None:
            self.events.emit("released", message=delivery.message, subscriber=session.client_id, qos=2)
        if session.store is not None:  # PUBREL only once RELEASED is durable, or a restart resends the PUBLISH
            self.store.after_commit(link.send, Pubrel(packet.packet_id))
        else:
            link.send(Pubrel(packet.packet_id))

    def _on_pubrel(self, session: Session, link: ClientLink, packet: Pubrel) -> None:
        packet_id = packet.packet_id
        if packet_id in session.incoming_qos2:
            del session.incoming_qos2[packet_id]
            if session.store is not None:
                self.store.delete_incoming_qos2(session.client_id, packet_id)
            self._ack(session, link, Pubcomp(packet_id), False)
        else:
            self._ack(session, link, Pubcomp(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND), False)

    def _on_subscribe(self, session: Session, link: ClientLink, packet: Subscribe) -> None:
        settings = self.settings
        v5 = link.protocol_version == MQTT_5
        sub_ids = packet.properties.subscription_identifiers
        sub_id = sub_ids[0] if sub_ids else None
        codes: list[int] = []
        accepted: list[tuple[str, SubscriptionOptions, bool]] = []
        record = session.record
        refusal = self.cluster.subscribe_refusal() if self.cluster is not None else None
        if refusal is not None:  # netsplit policy allow_subscribe = false
            self._ack(session, link, Suback(packet.packet_id, [refusal if v5 else 0x80] * len(packet.subscriptions)),
                      False)
            return
        for request in packet.subscriptions:
            topic_filter = request.topic_filter
            group, inner = split_shared(topic_filter)
            if group is not None and request.no_local:  # [MQTT-3.8.3-4]
                raise BrokerError("no local on a shared subscription", ReasonCode.PROTOCOL_ERROR)
            code = self._subscribe_refusal(topic_filter, group, inner, sub_id, record)
            if code is not None:
                codes.append(code if v5 else 0x80)
                continue
            qos = min(request.qos, settings.maximum_qos)
            options = SubscriptionOptions(
                qos, request.no_local, request.retain_as_published, request.retain_handling, sub_id
            )
            is_new = self.router.subscribe(session, topic_filter, options)
            accepted.append((topic_filter, options, is_new))
            codes.append(qos)
        suback = Suback(packet.packet_id, codes)
        if accepted and self.cluster is not None:
            self.cluster.session_changed(record)
        if session.store is not None and accepted:
            session.pending_acks += 1
            self.store.after_commit(self._finish_subscribe, session, link, suback, accepted)
        else:
            self._ack(session, link, suback, False)
            self._send_retained(session, accepted)

    def _subscribe_refusal(
        self, topic_filter: str, group: str | None, inner: str, sub_id: int | None, record: SessionRecord
    ) -> int | None:
        settings = self.settings
        try:
            validate_topic_filter(topic_filter)
        except Exception:
            return ReasonCode.TOPIC_FILTER_INVALID
        if group is not None and not settings.shared_subscriptions:
            return ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
        if not settings.wildcard_subscriptions and ("+" in inner or "#" in inner):
            return ReasonCode.WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED
        if sub_id is not None and not settings.subscription_identifiers:
            return ReasonCode.SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED
        if not self.acl.allowed(READ, record.username, record.client_id, inner):
            self.metrics.drop("acl_subscribe")
            return ReasonCode.NOT_AUTHORIZED
        return None

    def _finish_subscribe(
        self, session: Session, link: ClientLink, suback: Suback, accepted: list[tuple[str, SubscriptionOptions, bool]]
    ) -> None:
        session.pending_acks -= 1
        link.send(suback)
        self._send_retained(session, accepted)

    def _send_retained(self, session: Session, accepted: list[tuple[str, SubscriptionOptions, bool]]) -> None:
        for topic_filter, options, is_new in accepted:
            self.router.send_retained(session, topic_filter, options, is_new)

    def _on_unsubscribe(self, session: Session, link: ClientLink, packet: Unsubscribe) -> None:
        v5 = link.protocol_version == MQTT_5
        refusal = self.cluster.unsubscribe_refusal() if self.cluster is not None else None
        if refusal is not None:  # netsplit policy allow_unsubscribe = false
            if not v5:
                raise BrokerError("unsubscribe refused by the cluster policy", ReasonCode(refusal))
            self._ack(session, link, Unsuback(packet.packet_id, [refusal] * len(packet.topic_filters)), False)
            return
        codes = []
        for topic_filter in packet.topic_filters:
            existed = self.router.unsubscribe(session, topic_filter)
            codes.append(ReasonCode.SUCCESS if existed else ReasonCode.NO_SUBSCRIPTION_EXISTED)
        if self.cluster is not None:
            self.cluster.session_changed(session.record)
        unsuback = Unsuback(packet.packet_id, codes if v5 else [])  # type: ignore[arg-type]
        self._ack(session, link, unsuback, session.store is not None)

    def _on_disconnect(self, session: Session, link: ClientLink, packet: Disconnect) -> None:
        new_expiry = packet.properties.session_expiry_interval
        if new_expiry is not None:
            if session.record.expiry_interval == 0 and new_expiry > 0:  # [MQTT-3.14.2-2]
                raise BrokerError("session expiry raised from 0 at DISCONNECT", ReasonCode.PROTOCOL_ERROR)
            session.record.expiry_interval = min(new_expiry, self.settings.max_session_expiry)
            if new_expiry == 0 and session.store is not None:
                session.store = None
                self.store.delete_session(session.client_id)
        # Normal disconnection discards the will [MQTT-3.1.2-10]; 0x04 asks for it to be published.
        self._disconnected(session, publish_will=packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL)
        link.close(None)

    # -- internal publishing -------------------------------------------------------------------------------------
    def inject(
        self, topic: str, payload: bytes, qos: int, retain: bool, publisher: str, props: Properties | None = None
    ) -> None:
        """Route a message that did not come from a PUBLISH packet (wills, $SYS)."""
        now = self.clock()
        props = props or Properties()
        expiry = props.message_expiry_interval
        message = Message(
            self.new_message_id(), topic, payload, qos, retain, publisher, now,
            now + expiry if expiry is not None else None, props,
        )
        if retain:
            self.router.retain(message)
        cluster = self.cluster
        if cluster is None:
            self.router.route(message)
        else:
            _reached, _persisted, chosen = self.router.route(message, cluster.remote_shared(topic))
            cluster.route_remote(message, chosen)

    def publish_sys(self, topic: str, payload: bytes) -> None:
        """Publish a $SYS statistic: retained in memory only (it is regenerated after a restart)."""
        now = self.clock()
        message = Message(self.new_message_id(), topic, payload, 0, True, "", now)
        self.router.retained[topic] = message
        self.router.route(message)

    def shutdown(self) -> None:
        """Tell every v5 client the server is shutting down (DISCONNECT 0x8B) and close all connections."""
        for session in list(self.sessions.values()):
            link = session.link or session.connecting
            if link is not None:
                self._disconnected(session, publish_will=False)
                link.close(ReasonCode.SERVER_SHUTTING_DOWN)
