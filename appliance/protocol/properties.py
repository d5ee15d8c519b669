"""MQTT 5.0 properties [MQTT-2.2.2]: which packet may carry which property, and their wire encoding."""

from __future__ import annotations

from typing import Any

from .errors import MalformedPacket, ProtocolError
from .packets import PacketType, Properties
from .primitives import Reader, encode_binary, encode_u16, encode_u32, encode_utf8, encode_varint

# The Will Properties of CONNECT [MQTT-3.1.3.2] are validated as a pseudo packet type.
WILL = 0

BYTE, U16, U32, VARINT, UTF8, BINARY, PAIR = range(7)

_P = PacketType
_ACKS = (_P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP)
_ALL = (_P.CONNECT, _P.CONNACK, _P.PUBLISH, WILL, *_ACKS, _P.SUBSCRIBE, _P.SUBACK, _P.UNSUBSCRIBE, _P.UNSUBACK,
        _P.DISCONNECT, _P.AUTH)
_MESSAGE = (_P.PUBLISH, WILL)

# identifier -> (attribute, wire type, packet types allowed to carry it) — spec table 2-4.
PROPERTY_TABLE: dict[int, tuple[str, int, tuple[int, ...]]] = {
    0x01: ("payload_format_indicator", BYTE, _MESSAGE),
    0x02: ("message_expiry_interval", U32, _MESSAGE),
    0x03: ("content_type", UTF8, _MESSAGE),
    0x08: ("response_topic", UTF8, _MESSAGE),
    0x09: ("correlation_data", BINARY, _MESSAGE),
    0x0B: ("subscription_identifiers", VARINT, (_P.PUBLISH, _P.SUBSCRIBE)),
    0x11: ("session_expiry_interval", U32, (_P.CONNECT, _P.CONNACK, _P.DISCONNECT)),
    0x12: ("assigned_client_identifier", UTF8, (_P.CONNACK,)),
    0x13: ("server_keep_alive", U16, (_P.CONNACK,)),
    0x15: ("authentication_method", UTF8, (_P.CONNECT, _P.CONNACK, _P.AUTH)),
    0x16: ("authentication_data", BINARY, (_P.CONNECT, _P.CONNACK, _P.AUTH)),
    0x17: ("request_problem_information", BYTE, (_P.CONNECT,)),
    0x18: ("will_delay_interval", U32, (WILL,)),
    0x19: ("request_response_information", BYTE, (_P.CONNECT,)),
    0x1A: ("response_information", UTF8, (_P.CONNACK,)),
    0x1C: ("server_reference", UTF8, (_P.CONNACK, _P.DISCONNECT)),
    0x1F: ("reason_string", UTF8, (_P.CONNACK, *_ACKS, _P.SUBACK, _P.UNSUBACK, _P.DISCONNECT, _P.AUTH)),
    0x21: ("receive_maximum", U16, (_P.CONNECT, _P.CONNACK)),
    0x22: ("topic_alias_maximum", U16, (_P.CONNECT, _P.CONNACK)),
    0x23: ("topic_alias", U16, (_P.PUBLISH,)),
    0x24: ("maximum_qos", BYTE, (_P.CONNACK,)),
    0x25: ("retain_available", BYTE, (_P.CONNACK,)),
    0x26: ("user_properties", PAIR, _ALL),
    0x27: ("maximum_packet_size", U32, (_P.CONNECT, _P.CONNACK)),
    0x28: ("wildcard_subscription_available", BYTE, (_P.CONNACK,)),
    0x29: ("subscription_identifier_available", BYTE, (_P.CONNACK,)),
    0x2A: ("shared_subscription_available", BYTE, (_P.CONNACK,)),
}

# Byte properties whose only legal values are 0 and 1 (each property's own clause in [MQTT-3.x.2.x]).
_BOOLEAN_BYTES = {0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A}
# Properties that must not be zero: Receive Maximum [MQTT-3.1.2.11.3], Maximum Packet Size [MQTT-3.1.2.11.4],
# Subscription Identifier [MQTT-3.8.2.1.2].
_NONZERO = {0x21, 0x27, 0x0B}

# Per packet type: the (identifier, attribute, wire type) triples it may carry, in identifier order.
ALLOWED: dict[int, list[tuple[int, str, int]]] = {
    ptype: [(pid, attr, kind) for pid, (attr, kind, types) in sorted(PROPERTY_TABLE.items()) if ptype in types]
    for ptype in _ALL
}


def _encode_value(kind: int, value: Any) -> bytes:
    if kind == BYTE:
        if not 0 <= value <= 255:
            raise MalformedPacket(f"byte property value {value} out of range")
        return bytes((value,))
    if kind == U16:
        return encode_u16(value)
    if kind == U32:
        return encode_u32(value)
    if kind == VARINT:
        return encode_varint(value)
    if kind == UTF8:
        return encode_utf8(value)
    return encode_binary(value)


def encode_properties_body(props: Properties, ptype: int, skip: tuple[str, ...] = ()) -> bytes:
    """Encode the properties `ptype` may carry, without the length prefix; properties it may not carry are ignored."""
    out = bytearray()
    for pid, attr, kind in ALLOWED[ptype]:
        value = getattr(props, attr)
        if kind == PAIR:
            for name, val in value:
                out.append(pid)
                out += encode_utf8(name)
                out += encode_utf8(val)
        elif kind == VARINT:  # the Subscription Identifier list
            if attr in skip:
                continue
            for sub_id in value:
                if not 1 <= sub_id <= 268_435_455:
                    raise ProtocolError(f"subscription identifier {sub_id} out of range [MQTT-3.8.2.1.2]")
                out.append(pid)
                out += encode_varint(sub_id)
        elif value is not None and attr not in skip:
            out.append(pid)
            out += _encode_value(kind, value)
    return bytes(out)


def encode_properties(props: Properties, ptype: int) -> bytes:
    """Encode the Properties field (length prefix + body) for packet type `ptype` [MQTT-2.2.2.1]."""
    body = encode_properties_body(props, ptype)
    return encode_varint(len(body)) + body


def _read_value(reader: Reader, kind: int) -> Any:
    if kind == BYTE:
        return reader.u8()
    if kind == U16:
        return reader.u16()
    if kind == U32:
        return reader.u32()
    if kind == VARINT:
        return reader.varint()
    if kind == UTF8:
        return reader.utf8()
    if kind == BINARY:
        return reader.binary()
    return (reader.utf8(), reader.utf8())


def decode_properties(reader: Reader, ptype: int) -> Properties:
    """Read Properties: unknown / misplaced identifiers are malformed [MQTT-2.2.2.2], repeats protocol errors."""
    length = reader.varint()
    end = reader.pos + length
    if end > reader.end:
        raise MalformedPacket("property length runs past the end of the packet")
    props = Properties()
    if not length:
        return props
    outer_end = reader.end
    reader.end = end
    seen: set[int] = set()
    try:
        while reader.pos < end:
            pid = reader.varint()
            entry = PROPERTY_TABLE.get(pid)
            if entry is None:
                raise MalformedPacket(f"unknown property identifier 0x{pid:02X} [MQTT-2.2.2.2]")
            attr, kind, types = entry
            if ptype not in types:
                raise MalformedPacket(f"property {attr} not allowed in this packet [MQTT-2.2.2.2]")
            value = _read_value(reader, kind)
            if kind == PAIR:
                props.user_properties.append(value)
                continue
            if pid in seen and not (pid == 0x0B and ptype == PacketType.PUBLISH):
                raise ProtocolError(f"property {attr} included more than once")
            seen.add(pid)
            if pid in _BOOLEAN_BYTES and value > 1:
                raise ProtocolError(f"property {attr} must be 0 or 1, got {value}")
            if pid in _NONZERO and value == 0:
                raise ProtocolError(f"property {attr} must not be 0")
            if kind == VARINT:
                props.subscription_identifiers.append(value)
            else:
                setattr(props, attr, value)
    finally:
        reader.end = outer_end
    return props


def has_properties(props: Properties, ptype: int) -> bool:
    """Whether `props` holds any property `ptype` may carry (decides the short forms of acks and DISCONNECT)."""
    for _pid, attr, kind in ALLOWED[ptype]:
        value = getattr(props, attr)
        if (value if kind in (PAIR, VARINT) else value is not None):
            return True
    return False


