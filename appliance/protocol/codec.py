"""Packet encoding for MQTT 3.1.1 (level 4) and 5.0 (level 5), with a fast path for PUBLISH."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .errors import MalformedPacket, PacketTooLarge, ProtocolError
from .packets import (
    MQTT_5,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
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
)
from .primitives import MAX_VARINT, U16, encode_binary, encode_u16, encode_utf8, encode_varint
from .properties import WILL, encode_properties, encode_properties_body, has_properties
from .reason_codes import v311_connack_code, v311_suback_code

_SMALL = [bytes((n,)) for n in range(256)]
_PUBLISH_SPLICED = ("topic_alias", "subscription_identifiers")


def _frame(first_byte: int, body: bytes) -> bytes:
    """Prefix a body with its fixed header [MQTT-2.1.1]."""
    size = len(body)
    if size > MAX_VARINT:
        raise PacketTooLarge(f"remaining length {size} exceeds {MAX_VARINT} [MQTT-2.1.4]")
    return _SMALL[first_byte] + (_SMALL[size] if size < 128 else encode_varint(size)) + body


def encode_publish_properties(props: Properties) -> bytes:
    """Encode a message's PUBLISH properties once (no length prefix, no alias / subscription ids) for reuse."""
    if (props.payload_format_indicator is None and props.message_expiry_interval is None and props.content_type is None
            and props.response_topic is None and props.correlation_data is None and not props.user_properties):
        return b""
    return encode_properties_body(props, PacketType.PUBLISH, _PUBLISH_SPLICED)


def encode_publish(
    topic: str | bytes,
    payload: bytes,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    version: int = MQTT_5,
    properties: bytes = b"",
    subscription_ids: Sequence[int] = (),
    topic_alias: int | None = None,
) -> bytes:
    """Encode a PUBLISH; `properties` comes from encode_publish_properties, alias and subscription ids are spliced in.

    `topic` may be pre-encoded UTF-8 bytes; pass "" / b"" with a topic alias to send the alias alone.
    """
    if isinstance(topic, str):
        try:
            topic_bytes = topic.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise MalformedPacket("topic contains a surrogate code point [MQTT-1.5.4-1]") from exc
        if "\x00" in topic:
            raise MalformedPacket("topic contains U+0000 [MQTT-1.5.4-2]")
    else:
        topic_bytes = bytes(topic)
    tlen = len(topic_bytes)
    if tlen > 0xFFFF:
        raise MalformedPacket("topic longer than 65,535 bytes [MQTT-4.7.3-3]")
    if qos:
        if not 0 < qos < 3:
            raise MalformedPacket(f"QoS {qos} is not 0, 1 or 2 [MQTT-3.3.1-4]")
        if not packet_id or packet_id > 0xFFFF:
            raise ProtocolError(f"QoS {qos} PUBLISH needs a packet identifier 1..65535 [MQTT-2.2.1-3]")
        pid = U16[packet_id] if packet_id < 256 else packet_id.to_bytes(2, "big")
    else:
        if dup:
            raise MalformedPacket("DUP must be 0 for QoS 0 [MQTT-3.3.1-2]")
        pid = b""
    first = 0x30 | (qos << 1)
    if retain:
        first |= 1
    if dup:
        first |= 8
    if version == MQTT_5:
        if subscription_ids or topic_alias is not None:
            for sub_id in subscription_ids:
                if not 1 <= sub_id <= MAX_VARINT:
                    raise ProtocolError(f"subscription identifier {sub_id} out of range [MQTT-3.8.2.1.2]")
                properties += b"\x0b" + (_SMALL[sub_id] if sub_id < 128 else encode_varint(sub_id))
            if topic_alias is not None:
                properties += b"\x23" + (U16[topic_alias] if 0 <= topic_alias < 256 else encode_u16(topic_alias))
        plen = len(properties)
        props = (_SMALL[plen] if plen < 128 else encode_varint(plen)) + properties if plen else b"\x00"
    else:
        props = b""
    remaining = 2 + tlen + len(pid) + len(props) + len(payload)
    if remaining < 128:
        header = _SMALL[first] + _SMALL[remaining]
    else:
        if remaining > MAX_VARINT:
            raise PacketTooLarge(f"remaining length {remaining} exceeds {MAX_VARINT} [MQTT-2.1.4]")
        header = _SMALL[first] + encode_varint(remaining)
    return b"".join((header, U16[tlen] if tlen < 256 else tlen.to_bytes(2, "big"), topic_bytes, pid, props, payload))


def _publish(p: Publish, version: int) -> bytes:
    props = p.properties
    if version == MQTT_5:
        body = encode_publish_properties(props)
        return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, version, body,
                              props.subscription_identifiers, props.topic_alias)
    return encode_publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, version)


def _connect(p: Connect, version: int) -> bytes:
    if p.protocol_version != version:
        raise ProtocolError(f"CONNECT says level {p.protocol_version} but is encoded as level {version}")
    v5 = version == MQTT_5
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        if not 0 <= will.qos <= 2:
            raise MalformedPacket("Will QoS must be 0, 1 or 2 [MQTT-3.1.2-14]")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        if not v5 and p.username is None:
            raise MalformedPacket("3.1.1 forbids a password without a user name [MQTT-3.1.2-22]")
        flags |= 0x40
    parts = [encode_utf8(p.protocol_name), _SMALL[version], _SMALL[flags], encode_u16(p.keepalive)]
    if v5:
        parts.append(encode_properties(p.properties, PacketType.CONNECT))
    parts.append(encode_utf8(p.client_id))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties, WILL))
        parts.append(encode_utf8(will.topic))
        parts.append(encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_utf8(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _frame(0x10, b"".join(parts))


def _connack(p: Connack, version: int) -> bytes:
    flags = 1 if p.session_present else 0
    if version == MQTT_5:
        body = bytes((flags, p.reason_code)) + encode_properties(p.properties, PacketType.CONNACK)
    else:
        body = bytes((flags, v311_connack_code(p.reason_code)))
    return _frame(0x20, body)


def _ack(first_byte: int, ptype: PacketType) -> Callable[[Any, int], bytes]:
    """Encoder for PUBACK / PUBREC / PUBREL / PUBCOMP, using the short forms when possible [MQTT-3.4.2.1]."""

    def encode_ack(p: Puback | Pubrec | Pubrel | Pubcomp, version: int) -> bytes:
        pid = encode_u16(p.packet_id)
        if not p.packet_id:
            raise ProtocolError("packet identifier 0 is invalid [MQTT-2.2.1-3]")
        if version != MQTT_5:
            return _SMALL[first_byte] + b"\x02" + pid
        if has_properties(p.properties, ptype):
            return _frame(first_byte, pid + _SMALL[p.reason_code] + encode_properties(p.properties, ptype))
        if p.reason_code:
            return _SMALL[first_byte] + b"\x03" + pid + _SMALL[p.reason_code]
        return _SMALL[first_byte] + b"\x02" + pid

    return encode_ack


def _subscribe(p: Subscribe, version: int) -> bytes:
    if not p.subscriptions:
        raise ProtocolError("SUBSCRIBE needs at least one topic filter [MQTT-3.8.3-3]")
    parts = [encode_u16(p.packet_id)]
    if version == MQTT_5:
        parts.append(encode_properties(p.properties, PacketType.SUBSCRIBE))
    for sub in p.subscriptions:
        options = sub.qos
        if version == MQTT_5:
            options |= (4 if sub.no_local else 0) | (8 if sub.retain_as_published else 0) | (sub.retain_handling << 4)
        parts.append(encode_utf8(sub.topic_filter))
        parts.append(_SMALL[options])
    return _frame(0x82, b"".join(parts))


def _suback(p: Suback, version: int) -> bytes:
    if version == MQTT_5:
        codes = bytes(p.reason_codes)
        return _frame(0x90, encode_u16(p.packet_id) + encode_properties(p.properties, PacketType.SUBACK) + codes)
    return _frame(0x90, encode_u16(p.packet_id) + bytes(v311_suback_code(c) for c in p.reason_codes))


def _unsubscribe(p: Unsubscribe, version: int) -> bytes:
    if not p.topic_filters:
        raise ProtocolError("UNSUBSCRIBE needs at least one topic filter [MQTT-3.10.3-2]")
    parts = [encode_u16(p.packet_id)]
    if version == MQTT_5:
        parts.append(encode_properties(p.properties, PacketType.UNSUBSCRIBE))
    parts.extend(encode_utf8(f) for f in p.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _unsuback(p: Unsuback, version: int) -> bytes:
    if version == MQTT_5:
        props = encode_properties(p.properties, PacketType.UNSUBACK)
        return _frame(0xB0, encode_u16(p.packet_id) + props + bytes(p.reason_codes))
    return _frame(0xB0, encode_u16(p.packet_id))


def _reason_only(first_byte: int, ptype: PacketType) -> Callable[[Any, int], bytes]:
    """Encoder for DISCONNECT and AUTH: empty body when the reason is 0 with no properties [MQTT-3.14.2.1]."""

    def encode_reason(p: Disconnect | Auth, version: int) -> bytes:
        if version != MQTT_5:
            if ptype == PacketType.AUTH:
                raise ProtocolError("AUTH exists only in MQTT 5.0 [MQTT-3.15]")
            return _SMALL[first_byte] + b"\x00"
        if has_properties(p.properties, ptype):
            return _frame(first_byte, _SMALL[p.reason_code] + encode_properties(p.properties, ptype))
        if p.reason_code:
            return _SMALL[first_byte] + b"\x01" + _SMALL[p.reason_code]
        return _SMALL[first_byte] + b"\x00"

    return encode_reason


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _connect,
    Connack: _connack,
    Publish: _publish,
    Puback: _ack(0x40, PacketType.PUBACK),
    Pubrec: _ack(0x50, PacketType.PUBREC),
    Pubrel: _ack(0x62, PacketType.PUBREL),
    Pubcomp: _ack(0x70, PacketType.PUBCOMP),
    Subscribe: _subscribe,
    Suback: _suback,
    Unsubscribe: _unsubscribe,
    Unsuback: _unsuback,
    Pingreq: lambda p, v: b"\xc0\x00",
    Pingresp: lambda p, v: b"\xd0\x00",
    Disconnect: _reason_only(0xE0, PacketType.DISCONNECT),
    Auth: _reason_only(0xF0, PacketType.AUTH),
}


def encode(packet: Packet, version: int) -> bytes:
    """Encode any packet for protocol level `version` (4 = 3.1.1, 5 = 5.0); 3.1.1 drops what it has no field for."""
    try:
        encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise ProtocolError(f"not an MQTT packet: {type(packet).__name__}") from None
    try:
        return encoder(packet, version)
    except (ValueError, TypeError, OverflowError, IndexError) as exc:  # e.g. a reason code > 255
        raise MalformedPacket(f"cannot encode {type(packet).__name__}: {exc}") from exc
