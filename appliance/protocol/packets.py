"""Packet value types for MQTT 3.1.1 (protocol level 4) and 5.0 (level 5); the codec maps them to and from bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from .reason_codes import ReasonCode

MQTT_311 = 4
MQTT_5 = 5


class PacketType(IntEnum):
    """Control packet type, the high nibble of the fixed header [MQTT-2.1.2]."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


@dataclass(slots=True)
class Properties:
    """MQTT 5.0 properties [MQTT-2.2.2]; None means absent. Ignored (never encoded) for 3.1.1."""

    payload_format_indicator: int | None = None  # 0x01
    message_expiry_interval: int | None = None  # 0x02
    content_type: str | None = None  # 0x03
    response_topic: str | None = None  # 0x08
    correlation_data: bytes | None = None  # 0x09
    subscription_identifiers: list[int] = field(default_factory=list)  # 0x0B (repeatable in PUBLISH)
    session_expiry_interval: int | None = None  # 0x11
    assigned_client_identifier: str | None = None  # 0x12
    server_keep_alive: int | None = None  # 0x13
    authentication_method: str | None = None  # 0x15
    authentication_data: bytes | None = None  # 0x16
    request_problem_information: int | None = None  # 0x17
    will_delay_interval: int | None = None  # 0x18
    request_response_information: int | None = None  # 0x19
    response_information: str | None = None  # 0x1A
    server_reference: str | None = None  # 0x1C
    reason_string: str | None = None  # 0x1F
    receive_maximum: int | None = None  # 0x21
    topic_alias_maximum: int | None = None  # 0x22
    topic_alias: int | None = None  # 0x23
    maximum_qos: int | None = None  # 0x24
    retain_available: int | None = None  # 0x25
    user_properties: list[tuple[str, str]] = field(default_factory=list)  # 0x26, order preserved [MQTT-3.3.2-18]
    maximum_packet_size: int | None = None  # 0x27
    wildcard_subscription_available: int | None = None  # 0x28
    subscription_identifier_available: int | None = None  # 0x29
    shared_subscription_available: int | None = None  # 0x2A


# One shared all-default Properties for hot-path packets that carry none (decoded 3.1.1 / property-less PUBLISHes,
# two-byte acks, the broker's plain PUBACKs): it saves an object of 27 fields per packet. Never mutate it (or the
# Properties of a received packet): copy with dataclasses.replace instead.
NO_PROPERTIES = Properties()


@dataclass(slots=True)
class Will:
    """The Will Message carried in CONNECT [MQTT-3.1.2.5]."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    """CONNECT [MQTT-3.1]."""

    client_id: str
    protocol_version: int = MQTT_311
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)
    protocol_name: str = "MQTT"


@dataclass(slots=True)
class Connack:
    """CONNACK [MQTT-3.2]; reason_code is a v5 code, mapped to a 3.1.1 return code on encode."""

    session_present: bool = False
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Publish:
    """PUBLISH [MQTT-3.3]; topic may be "" when a v5 topic alias stands in for it."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Puback:
    """PUBACK [MQTT-3.4]."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pubrec:
    """PUBREC [MQTT-3.5]."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pubrel:
    """PUBREL [MQTT-3.6]."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pubcomp:
    """PUBCOMP [MQTT-3.7]."""

    packet_id: int
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubscriptionRequest:
    """One topic filter with its subscription options [MQTT-3.8.3.1]."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE [MQTT-3.8]."""

    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Suback:
    """SUBACK [MQTT-3.9]; one reason code per requested filter, in order."""

    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE [MQTT-3.10]."""

    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsuback:
    """UNSUBACK [MQTT-3.11]; reason codes exist only in v5 (empty list for 3.1.1)."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Pingreq:
    """PINGREQ [MQTT-3.12]."""


@dataclass(slots=True)
class Pingresp:
    """PINGRESP [MQTT-3.13]."""


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT [MQTT-3.14]; reason code and properties are v5 only."""

    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    """AUTH [MQTT-3.15], MQTT 5.0 only."""

    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=Properties)


Packet = (
    Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback | Unsubscribe | Unsuback
    | Pingreq | Pingresp | Disconnect | Auth
)

PACKET_TYPES: dict[type, PacketType] = {
    Connect: PacketType.CONNECT,
    Connack: PacketType.CONNACK,
    Publish: PacketType.PUBLISH,
    Puback: PacketType.PUBACK,
    Pubrec: PacketType.PUBREC,
    Pubrel: PacketType.PUBREL,
    Pubcomp: PacketType.PUBCOMP,
    Subscribe: PacketType.SUBSCRIBE,
    Suback: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE,
    Unsuback: PacketType.UNSUBACK,
    Pingreq: PacketType.PINGREQ,
    Pingresp: PacketType.PINGRESP,
    Disconnect: PacketType.DISCONNECT,
    Auth: PacketType.AUTH,
}
