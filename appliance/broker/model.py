"""Broker domain records shared by the rules and the adapters: messages, queued deliveries, sessions, subscriptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from appliance.protocol.packets import Properties, Will


@dataclass(slots=True)
class Message:
    """An application message as accepted from a publisher; immutable once routed."""

    msg_id: str  # cluster-unique, assigned where the message first entered the cluster
    topic: str
    payload: bytes
    qos: int
    retain: bool
    publisher: str  # client id of the publisher ("" for wills of anonymous clients / $SYS)
    created: float  # wall clock, seconds since the epoch
    expiry_at: float | None = None  # wall clock deadline from Message Expiry Interval
    properties: Properties = field(default_factory=Properties)  # publication props: no alias, no sub ids
    wire_properties: bytes | None = field(default=None, compare=False)  # encoded once by the first sender


class DeliveryState(IntEnum):
    """Where a queued delivery stands in the outbound QoS flow [MQTT-4.3]."""

    QUEUED = 0  # not yet sent on the current connection
    SENT = 1  # PUBLISH sent, awaiting PUBACK (QoS1) or PUBREC (QoS2)
    RELEASED = 2  # QoS2: PUBREL sent, awaiting PUBCOMP


@dataclass(slots=True)
class Delivery:
    """One message queued for one session; removed only when the subscriber's PUBACK / PUBCOMP arrives."""

    seq: int  # per-session order key, strictly increasing in enqueue order
    message: Message
    qos: int  # effective QoS: min(publish QoS, granted QoS)
    retain: bool  # RETAIN flag to send (retain-as-published or retained-on-subscribe)
    subscription_ids: list[int] = field(default_factory=list)
    packet_id: int | None = None
    state: DeliveryState = DeliveryState.QUEUED
    attempts: int = 0


@dataclass(slots=True)
class SubscriptionOptions:
    """The options a session subscribed a filter with [MQTT-3.8.3.1]."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


@dataclass(slots=True)
class SessionRecord:
    """The durable part of a session [MQTT-4.1]: what survives a restart."""

    client_id: str
    protocol_version: int
    expiry_interval: int  # seconds; 0xFFFFFFFF never expires; 3.1.1 clean_session=0 maps to never
    disconnected_at: float | None = None  # wall clock of the last disconnect (None while connected)
    will: Will | None = None  # pending will (kept for will delay across restarts)
    will_due_at: float | None = None
    username: str | None = None
    next_seq: int = 1
    subscriptions: dict[str, SubscriptionOptions] = field(default_factory=dict)
