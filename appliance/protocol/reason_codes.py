"""MQTT 5.0 reason codes [MQTT-2.4] and the MQTT 3.1.1 CONNACK return codes they map to."""

from __future__ import annotations

from enum import IntEnum


class ReasonCode(IntEnum):
    """Every MQTT 5.0 reason code (spec table 2-6); 3.1.1 reuses a subset on the wire."""

    SUCCESS = 0x00  # also NORMAL_DISCONNECTION and GRANTED_QOS_0
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


NORMAL_DISCONNECTION = ReasonCode.SUCCESS
GRANTED_QOS_0 = ReasonCode.SUCCESS

# MQTT 3.1.1 CONNACK return codes [MQTT-3.2.2.3] (0x00 accepted).
V311_CONNACK = {
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: 0x01,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: 0x02,
    ReasonCode.SERVER_UNAVAILABLE: 0x03,
    ReasonCode.SERVER_BUSY: 0x03,
    ReasonCode.SERVER_SHUTTING_DOWN: 0x03,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: 0x04,
    ReasonCode.NOT_AUTHORIZED: 0x05,
    ReasonCode.BANNED: 0x05,
}


def v311_connack_code(code: int) -> int:
    """Map a v5 CONNACK reason code to the nearest 3.1.1 return code (unknown failures become 0x03)."""
    if code == ReasonCode.SUCCESS:
        return 0
    return V311_CONNACK.get(ReasonCode(code), 0x03) if code in ReasonCode._value2member_map_ else 0x03


def v311_suback_code(code: int) -> int:
    """3.1.1 SUBACK carries only granted QoS or 0x80 failure [MQTT-3.9.3]."""
    return code if code <= 2 else 0x80
