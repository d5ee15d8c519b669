"""Client-side receipts: sequence-numbered publishes and what was acked and received, in delivery-log schema v1."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .sink import DeliveryLog

DEFAULT_SEQ_PROPERTY = "seq"
DEFAULT_PUBLISHER_PROPERTY = "pub"


@dataclass(frozen=True, slots=True)
class Stamp:
    """What to attach to one outgoing PUBLISH: its sequence number as MQTT 5 user properties."""

    seq: int
    topic: str
    qos: int
    retain: bool
    payload_size: int
    user_properties: list[tuple[str, str]]


class ReceiptLogger:
    """Numbers a client's publishes and records client_published / client_acked / client_received events.

    Writes with source="client" and node=<client id>. Thread-safe: MQTT libraries call back from their own threads.
    """

    def __init__(
        self,
        directory: str,
        *,
        client_id: str,
        fleet: str,
        device: str,
        firmware: str,
        seq_property: str = DEFAULT_SEQ_PROPERTY,
        publisher_property: str | None = DEFAULT_PUBLISHER_PROPERTY,
        first_seq: int = 1,
        **log_options: Any,
    ) -> None:
        self.client_id = client_id
        self.seq_property = seq_property
        self.publisher_property = publisher_property
        log_options.setdefault("process", False)  # a client logs little: a thread is enough, no child process
        self.log = DeliveryLog(
            directory, fleet=fleet, device=device, node=client_id, firmware=firmware, source="client", **log_options
        )
        self._next = first_seq
        self._lock = threading.Lock()
        self._by_packet: dict[int, Stamp] = {}  # in flight (QoS > 0), by packet id

    def stamp(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False) -> Stamp:
        """Assign the next sequence number to a publish about to be sent."""
        size = len(payload.encode() if isinstance(payload, str) else payload)
        with self._lock:
            seq = self._next
            self._next += 1
        props = [(self.seq_property, str(seq))]
        if self.publisher_property:
            props.append((self.publisher_property, self.client_id))
        return Stamp(seq, topic, qos, retain, size, props)

    def published(self, stamp: Stamp, packet_id: int | None = None) -> None:
        """Record that the PUBLISH carrying `stamp` was handed to the network."""
        if packet_id is not None and stamp.qos > 0:
            with self._lock:
                self._by_packet[packet_id] = stamp
        self.log.emit("client_published", **self._fields(stamp, packet_id))

    def acked(self, packet_id: int, reason: str | int | None = None) -> bool:
        """Record the PUBACK / PUBCOMP for `packet_id`; False if no publish with that packet id is in flight."""
        with self._lock:
            stamp = self._by_packet.pop(packet_id, None)
        if stamp is None:
            return False
        fields = self._fields(stamp, packet_id)
        if reason is not None:
            fields["reason"] = str(reason)
        self.log.emit("client_acked", **fields)
        return True

    def received(
        self,
        topic: str,
        payload: bytes | str,
        qos: int,
        retain: bool,
        user_properties: Iterable[tuple[str, str]] = (),
        *,
        dup: bool | None = None,
        subscription_filter: str | None = None,
    ) -> int | None:
        """Record one received PUBLISH; returns the publisher's sequence number if it carried one."""
        seq: int | None = None
        publisher: str | None = None
        reason: str | None = None
        for name, value in user_properties:
            if name == self.seq_property:
                try:
                    seq = int(value)
                except ValueError:
                    reason = f"bad {self.seq_property} property {value[:40]!r}"
            elif self.publisher_property and name == self.publisher_property:
                publisher = value
        size = len(payload.encode() if isinstance(payload, str) else payload)
        self.log.emit(
            "client_received",
            publisher=publisher,
            publisher_seq=seq,
            topic=topic,
            qos=qos,
            retain=retain,
            payload_size=size,
            subscriber=self.client_id,
            filter=subscription_filter,
            dup=dup,
            reason=reason,
        )
        return seq

    def _fields(self, stamp: Stamp, packet_id: int | None) -> dict[str, Any]:
        """The fields shared by client_published and client_acked."""
        return {
            "publisher": self.client_id,
            "publisher_packet_id": packet_id,
            "publisher_seq": stamp.seq,
            "topic": stamp.topic,
            "qos": stamp.qos,
            "retain": stamp.retain,
            "payload_size": stamp.payload_size,
        }

    @property
    def in_flight(self) -> int:
        """Publishes sent with QoS > 0 and not yet acknowledged."""
        with self._lock:
            return len(self._by_packet)

    def flush(self) -> None:
        """Block until every recorded receipt is written."""
        self.log.flush()

    def close(self) -> None:
        """Write everything and close the log."""
        self.log.close()

    def __enter__(self) -> ReceiptLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PahoReceipts:
    """Wires a ReceiptLogger into a paho-mqtt 2.x MQTT 5 client: publish() stamps, callbacks record the rest."""

    def __init__(self, receipts: ReceiptLogger, client: Any) -> None:
        self.receipts = receipts
        self.client = client
        self._user_on_message: Callable[..., Any] | None = client.on_message
        client.on_publish = self._on_publish
        client.on_message = self._on_message

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False) -> Any:
        """Publish with the next sequence number and record it; returns paho's MQTTMessageInfo."""
        from paho.mqtt.packettypes import PacketTypes  # only clients that use paho need it
        from paho.mqtt.properties import Properties

        stamp = self.receipts.stamp(topic, payload, qos, retain)
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = stamp.user_properties
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=props)
        self.receipts.published(stamp, info.mid if qos > 0 else None)
        return info

    def on_message(self, handler: Callable[..., Any] | None) -> None:
        """Also call `handler(client, userdata, message)` for every message after it is recorded."""
        self._user_on_message = handler

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any = None, props: Any = None) -> None:
        """paho's on_publish: the broker acknowledged `mid` (QoS 1/2)."""
        reason = None if reason_code is None or getattr(reason_code, "value", 0) == 0 else str(reason_code)
        self.receipts.acked(mid, reason)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        """paho's on_message: record the receipt, then hand the message on."""
        props = getattr(message, "properties", None)
        user_props = getattr(props, "UserProperty", None) or []
        self.receipts.received(message.topic, message.payload, message.qos, bool(message.retain), user_props,
                               dup=bool(message.dup))
        if self._user_on_message is not None:
            self._user_on_message(client, userdata, message)
