"""A client session: ordered outbound queue, inflight window, packet ids, QoS1/QoS2 outbound flows [MQTT-4.3, 4.4]."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from appliance.protocol.packets import Packet, Pubrel

from .model import Delivery, DeliveryState, Message, SessionRecord
from .ports import EventSink, Store

NEVER_EXPIRES = 0xFFFFFFFF
_SENT = DeliveryState.SENT  # a global: the enum attribute lookup is slow on the hot path


class ClientLink(Protocol):
    """The live network connection of a session, implemented by the server wiring."""

    protocol_version: int

    def send(self, packet: Packet) -> None: ...

    def publish(
        self, message: Message, qos: int, retain: bool, packet_id: int | None, dup: bool, subscription_ids: list[int]
    ) -> bool: ...  # False when the client's Maximum Packet Size forbids it [MQTT-3.1.2-25]

    def close(self, reason_code: int | None = None) -> None: ...


class Session:
    """Per-client state that outlives connections when the session is persistent."""

    __slots__ = (
        "_next_packet_id",
        "client_id",
        "clock",
        "connected_at",
        "connecting",
        "events",
        "expires_at",
        "incoming_qos2",
        "inflight",
        "link",
        "pending_acks",
        "queue",
        "receive_maximum",
        "record",
        "store",
    )

    def __init__(
        self, record: SessionRecord, store: Store | None, clock: Callable[[], float], events: EventSink | None = None
    ) -> None:
        self.record = record
        self.client_id = record.client_id  # the record's, which never changes
        self.link: ClientLink | None = None
        self.queue: deque[Delivery] = deque()  # waiting, in seq order
        self.inflight: dict[int, Delivery] = {}  # packet id -> delivery, insertion order = send order
        self.incoming_qos2: dict[int, Message | None] = {}  # QoS2 packet ids received, PUBREL not yet seen
        self.receive_maximum = 65535
        self._next_packet_id = 1
        self.pending_acks = 0  # publisher acks waiting on a commit, keeps PUBACK order [MQTT-4.6.0-2]
        self.expires_at: float | None = None
        self.store = store  # None for a non-persistent session: nothing of it is written
        self.connected_at: float | None = None
        self.connecting: ClientLink | None = None  # accepted CONNECT whose CONNACK waits for a commit
        self.clock = clock
        self.events = events

    @property
    def persistent(self) -> bool:
        """True when the session outlives its connection (session expiry > 0)."""
        return self.record.expiry_interval > 0

    @property
    def online(self) -> bool:
        """True while a network connection is attached."""
        return self.link is not None

    def queued_count(self) -> int:
        """Messages held for the client: waiting plus inflight."""
        return len(self.queue) + len(self.inflight)

    def next_seq(self) -> int:
        """Allocate the next per-session order key."""
        seq = self.record.next_seq
        self.record.next_seq = seq + 1
        return seq

    def _allocate_packet_id(self) -> int:
        pid = self._next_packet_id
        if pid not in self.inflight:
            self._next_packet_id = pid % 65535 + 1
            return pid
        for _ in range(65535):
            if pid not in self.inflight:
                self._next_packet_id = pid % 65535 + 1
                return pid
            pid = pid % 65535 + 1
        raise RuntimeError("no free packet identifier")  # unreachable: the window is < 65535

    def enqueue(self, delivery: Delivery) -> None:
        """Append a QoS>0 delivery in order and persist it when the session is persistent."""
        link = self.link
        if link is not None and delivery.qos == 1 and not self.queue and len(self.inflight) < self.receive_maximum:
            expiry_at = delivery.message.expiry_at
            if expiry_at is None or expiry_at > self.clock():
                self._send_now(link, delivery)
                return
        if self.store is not None:
            self.store.enqueue(self.record.client_id, delivery)
        self.queue.append(delivery)
        if link is not None:
            self.pump()

    def _send_now(self, link: ClientLink, delivery: Delivery) -> None:
        """enqueue + pump for a QoS1 delivery the window has room for: its queue row is written SENT at once."""
        pid = self._allocate_packet_id()
        delivery.packet_id = pid
        delivery.state = _SENT
        self.inflight[pid] = delivery
        if self.store is not None:
            self.store.enqueue(self.record.client_id, delivery)  # the row pump's enqueue + update would leave
        delivery.attempts += 1
        self._send_first(link, delivery, pid)

    def pump(self) -> None:
        """Send waiting deliveries while the inflight window has room [MQTT-4.9]."""
        link = self.link
        if link is None:
            return
        queue, inflight = self.queue, self.inflight
        window = self.receive_maximum
        now = self.clock()
        while queue and len(inflight) < window:
            delivery = queue.popleft()
            expiry_at = delivery.message.expiry_at
            if expiry_at is not None and expiry_at <= now:  # expired while queued [MQTT-3.3.2-5]
                if self.store is not None:
                    self.store.remove_delivery(self.record.client_id, delivery.seq)
                if self.events is not None:
                    self.events.emit("expired", message=delivery.message, subscriber=self.record.client_id)
                continue
            if delivery.qos == 0:  # queued QoS0 (queue_qos0_offline): fire and forget
                link.publish(delivery.message, 0, delivery.retain, None, False, delivery.subscription_ids)
                if self.store is not None:
                    self.store.remove_delivery(self.record.client_id, delivery.seq)
                continue
            pid = self._allocate_packet_id()
            delivery.packet_id = pid
            delivery.state = _SENT
            delivery.attempts += 1
            inflight[pid] = delivery
            if self.store is not None:
                self.store.update_delivery(self.record.client_id, delivery.seq, _SENT, pid)
                if delivery.qos == 2:
                    # A QoS2 packet id may reach the client only once it is durable: a restart must resend it
                    # with DUP under the same id, never as a new message under another one [MQTT-4.3.3, MQTT-4.4.0-1].
                    self.store.after_commit(self._send_committed, link, delivery, pid)
                    continue
            self._send_first(link, delivery, pid)

    def _send_committed(self, link: ClientLink, delivery: Delivery, pid: int) -> None:
        if self.link is link and self.inflight.get(pid) is delivery:
            self._send_first(link, delivery, pid)

    def _send_first(self, link: ClientLink, delivery: Delivery, pid: int) -> None:
        if self.events is not None:
            self.events.record_delivered(delivery.message.msg_id, self.record.client_id, delivery.qos, False,
                                         delivery.attempts)
        if not link.publish(delivery.message, delivery.qos, delivery.retain, pid, False, delivery.subscription_ids):
            del self.inflight[pid]  # too large for this client: dropped, never retried [MQTT-3.1.2-25]
            if self.store is not None:
                self.store.remove_delivery(self.record.client_id, delivery.seq)

    def resend_inflight(self) -> None:
        """On reconnect: resend unacknowledged PUBLISH with DUP and PUBREL in the original order [MQTT-4.4.0-1]."""
        link = self.link
        if link is None:
            return
        for pid, delivery in list(self.inflight.items()):
            if delivery.state == DeliveryState.RELEASED:
                link.send(Pubrel(pid))
            else:
                delivery.attempts += 1
                if self.events is not None:
                    self.events.record_delivered(delivery.message.msg_id, self.record.client_id, delivery.qos, True,
                                                 delivery.attempts)
                link.publish(delivery.message, delivery.qos, delivery.retain, pid, True, delivery.subscription_ids)

    def complete(self, packet_id: int) -> Delivery | None:
        """PUBACK / PUBCOMP arrived: release the entry (only now is it deleted from disk) and refill the window."""
        delivery = self.inflight.pop(packet_id, None)
        if delivery is None:
            return None
        if self.store is not None:
            self.store.remove_delivery(self.record.client_id, delivery.seq)
        if self.queue and self.link is not None:
            self.pump()
        return delivery

    def released(self, packet_id: int) -> Delivery | None:
        """PUBREC arrived for a QoS2 delivery: the message is now owned by the client, PUBREL follows."""
        delivery = self.inflight.get(packet_id)
        if delivery is None or delivery.qos != 2:
            return None
        delivery.state = DeliveryState.RELEASED
        if self.store is not None:
            self.store.update_delivery(self.record.client_id, delivery.seq, DeliveryState.RELEASED, packet_id)
        return delivery

    def drop_oldest(self) -> Delivery | None:
        """Remove the oldest waiting delivery (queue-full policy drop-oldest)."""
        if not self.queue:
            return None
        delivery = self.queue.popleft()
        if self.store is not None:
            self.store.remove_delivery(self.record.client_id, delivery.seq)
        return delivery
