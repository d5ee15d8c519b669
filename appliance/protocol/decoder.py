"""Incremental packet decoding: bytes in, validated packets out; every failure is an MQTTError."""

from __future__ import annotations

import struct
from collections.abc import Callable

from .errors import MalformedPacket, MQTTError, PacketTooLarge, ProtocolError, UnsupportedProtocolVersion
from .packets import (
    MQTT_5,
    MQTT_311,
    NO_PROPERTIES,
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
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
    Will,
)
from .primitives import Reader
from .properties import WILL, decode_properties
from .reason_codes import ReasonCode

_P = PacketType

# Reason codes each v5 packet may carry (spec tables in 3.2.2.2, 3.4.2.1, 3.6.2.1, 3.9.3, 3.11.3, 3.14.2.1, 3.15.2.1).
_CONNACK_CODES = frozenset({0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95,
                            0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F})
_PUBACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
_PUBREL_CODES = frozenset({0x00, 0x92})
_SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
_UNSUBACK_CODES = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
_DISCONNECT_CODES = frozenset({0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93,
                               0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1,
                               0xA2})
_AUTH_CODES = frozenset({0x00, 0x18, 0x19})
REASON_CODES: dict[int, frozenset[int]] = {
    _P.CONNACK: _CONNACK_CODES, _P.PUBACK: _PUBACK_CODES, _P.PUBREC: _PUBACK_CODES, _P.PUBREL: _PUBREL_CODES,
    _P.PUBCOMP: _PUBREL_CODES, _P.SUBACK: _SUBACK_CODES, _P.UNSUBACK: _UNSUBACK_CODES,
    _P.DISCONNECT: _DISCONNECT_CODES, _P.AUTH: _AUTH_CODES,
}
# 3.1.1 CONNACK return codes [MQTT-3.2.2.3] as the v5 codes Connack.reason_code holds.
_SUCCESS = ReasonCode.SUCCESS  # a global: the enum attribute lookup is slow on the hot path
_V311_CONNACK_TO_V5 = {0: ReasonCode.SUCCESS, 1: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
                       2: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, 3: ReasonCode.SERVER_UNAVAILABLE,
                       4: ReasonCode.BAD_USER_NAME_OR_PASSWORD, 5: ReasonCode.NOT_AUTHORIZED}
_V311_SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80})
# Fixed-header flags every packet but PUBLISH must carry [MQTT-2.1.3-1].
_REQUIRED_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}
_NAMES = {t.value: t.name for t in PacketType}
# First bytes of the acknowledgements whose two-byte form the Decoder takes without a Reader.
_SHORT_ACKS: dict[int, type[Puback | Pubrec | Pubrel | Pubcomp]] = {0x40: Puback, 0x50: Pubrec, 0x62: Pubrel,
                                                                    0x70: Pubcomp}


def invalid_topic_name(topic: str) -> str | None:
    """Why `topic` cannot be a PUBLISH / Will topic name, or None [MQTT-3.3.2-2, MQTT-4.7.3-1]."""
    if "+" in topic or "#" in topic:
        return "topic name contains a wildcard [MQTT-3.3.2-2]"
    if not topic:
        return "topic name is empty [MQTT-4.7.3-1]"
    return None


def _reason(r: Reader, ptype: int) -> int:
    code = r.u8()
    if code not in REASON_CODES[ptype]:
        raise MalformedPacket(f"reason code 0x{code:02X} is not valid in {_NAMES[ptype]}")
    return code


def _packet_id(r: Reader) -> int:
    pid = r.u16()
    if not pid:
        raise ProtocolError("packet identifier 0 is invalid [MQTT-2.2.1-3]")
    return pid


def _publish(flags: int, r: Reader, v5: bool) -> Publish:
    """General PUBLISH decoding (the Decoder inlines a fast path for the common cases)."""
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3 [MQTT-3.3.1-4]")
    if flags & 8 and not qos:
        raise MalformedPacket("DUP set on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
    topic = r.utf8()
    packet_id = _packet_id(r) if qos else None
    props = decode_properties(r, _P.PUBLISH) if v5 else Properties()
    if "+" in topic or "#" in topic:
        raise ProtocolError("topic name contains a wildcard [MQTT-3.3.2-2]", ReasonCode.TOPIC_NAME_INVALID)
    if not topic and (not v5 or props.topic_alias is None):
        raise ProtocolError("empty topic name without a topic alias [MQTT-3.3.2-1, MQTT-4.7.3-1]",
                            ReasonCode.TOPIC_NAME_INVALID)
    return Publish(topic, r.rest(), qos, bool(flags & 1), bool(flags & 8), packet_id, props)


def _connect_flags(flags: int, v5: bool) -> None:
    """Validate CONNECT flags [MQTT-3.1.2-3, MQTT-3.1.2-11..15, MQTT-3.1.2-22]."""
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set [MQTT-3.1.2-3]")
    will_qos = (flags >> 3) & 3
    if not flags & 0x04 and (will_qos or flags & 0x20):
        raise MalformedPacket("Will QoS / Will Retain set without the Will Flag [MQTT-3.1.2-11, MQTT-3.1.2-13]")
    if will_qos == 3:
        raise MalformedPacket("Will QoS 3 [MQTT-3.1.2-14]")
    if not v5 and flags & 0x40 and not flags & 0x80:
        raise MalformedPacket("password flag without user name flag [MQTT-3.1.2-22]")


def _connect(r: Reader, decoder: Decoder) -> Connect:
    name = r.utf8()
    level = r.u8()
    if level not in (MQTT_311, MQTT_5):
        raise UnsupportedProtocolVersion(f"protocol level {level} is not supported [MQTT-3.1.2-2]")
    if decoder.protocol_version is None:
        decoder.protocol_version = level  # set before the rest is checked, so errors are answered in this version
    if name != "MQTT":
        raise UnsupportedProtocolVersion(f"protocol name {name!r} is not MQTT [MQTT-3.1.2-1]")
    v5 = level == MQTT_5
    flags = r.u8()
    _connect_flags(flags, v5)
    keepalive = r.u16()
    props = decode_properties(r, _P.CONNECT) if v5 else Properties()
    client_id = r.utf8()
    will = None
    if flags & 0x04:
        will_props = decode_properties(r, WILL) if v5 else Properties()
        will_topic = r.utf8()
        problem = invalid_topic_name(will_topic)
        if problem:
            raise ProtocolError(f"Will {problem}", ReasonCode.TOPIC_NAME_INVALID)
        will = Will(will_topic, r.binary(), (flags >> 3) & 3, bool(flags & 0x20), will_props)
    username = r.utf8() if flags & 0x80 else None
    password = r.binary() if flags & 0x40 else None
    r.expect_end("CONNECT")
    return Connect(client_id, level, bool(flags & 0x02), keepalive, username, password, will, props, name)


def _connack(r: Reader, v5: bool) -> Connack:
    flags = r.u8()
    if flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags set [MQTT-3.2.2-1]")
    if v5:
        code = _reason(r, _P.CONNACK)
        props = decode_properties(r, _P.CONNACK)
    else:
        raw = r.u8()
        if raw not in _V311_CONNACK_TO_V5:
            raise MalformedPacket(f"CONNACK return code {raw} is reserved [MQTT-3.2.2.3]")
        code, props = _V311_CONNACK_TO_V5[raw], Properties()
    r.expect_end("CONNACK")
    return Connack(bool(flags), code, props)


def _ack(cls: type[Puback | Pubrec | Pubrel | Pubcomp], ptype: PacketType) -> Callable[[Reader, bool], Packet]:
    def decode_ack(r: Reader, v5: bool) -> Packet:
        pid = _packet_id(r)
        code, props = 0, None
        if v5 and r.remaining():
            code = _reason(r, ptype)
            if r.remaining():
                props = decode_properties(r, ptype)
        r.expect_end(ptype.name)
        return cls(pid, code, props or Properties())

    return decode_ack


def _subscribe(r: Reader, v5: bool) -> Subscribe:
    pid = _packet_id(r)
    props = decode_properties(r, _P.SUBSCRIBE) if v5 else Properties()
    subs = []
    while r.remaining():
        topic_filter = r.utf8()
        options = r.u8()
        qos = options & 3
        if qos == 3:
            raise MalformedPacket("subscription QoS 3 [MQTT-3.8.3-4]")
        if v5:
            if options & 0xC0:
                raise MalformedPacket("reserved subscription option bits set [MQTT-3.8.3-5]")
            retain_handling = (options >> 4) & 3
            if retain_handling == 3:
                raise ProtocolError("retain handling 3 [MQTT-3.8.3.1]")
            no_local = bool(options & 4)
            if no_local and topic_filter.startswith("$share/"):
                raise ProtocolError("No Local on a shared subscription [MQTT-3.8.3-4]")
            subs.append(SubscriptionRequest(topic_filter, qos, no_local, bool(options & 8), retain_handling))
        else:
            if options & 0xFC:
                raise MalformedPacket("reserved subscription option bits set [MQTT-3.8.3-4]")
            subs.append(SubscriptionRequest(topic_filter, qos))
    if not subs:
        raise ProtocolError("SUBSCRIBE with no topic filter [MQTT-3.8.3-3]")
    return Subscribe(pid, subs, props)


def _suback(r: Reader, v5: bool) -> Suback:
    pid = _packet_id(r)
    props = decode_properties(r, _P.SUBACK) if v5 else Properties()
    codes = list(r.rest())
    allowed = _SUBACK_CODES if v5 else _V311_SUBACK_CODES
    if not codes or any(c not in allowed for c in codes):
        raise MalformedPacket("SUBACK needs one valid return code per filter [MQTT-3.9.3]")
    return Suback(pid, codes, props)


def _unsubscribe(r: Reader, v5: bool) -> Unsubscribe:
    pid = _packet_id(r)
    props = decode_properties(r, _P.UNSUBSCRIBE) if v5 else Properties()
    filters = []
    while r.remaining():
        filters.append(r.utf8())
    if not filters:
        raise ProtocolError("UNSUBSCRIBE with no topic filter [MQTT-3.10.3-2]")
    return Unsubscribe(pid, filters, props)


def _unsuback(r: Reader, v5: bool) -> Unsuback:
    pid = _packet_id(r)
    if not v5:
        r.expect_end("UNSUBACK")
        return Unsuback(pid)
    props = decode_properties(r, _P.UNSUBACK)
    codes = list(r.rest())
    if not codes or any(c not in _UNSUBACK_CODES for c in codes):
        raise MalformedPacket("UNSUBACK needs one valid reason code per filter [MQTT-3.11.3]")
    return Unsuback(pid, codes, props)


def _empty(cls: type[Pingreq | Pingresp]) -> Callable[[Reader, bool], Packet]:
    def decode_empty(r: Reader, v5: bool) -> Packet:
        r.expect_end(cls.__name__.upper())
        return cls()

    return decode_empty


def _reason_only(cls: type[Disconnect | Auth], ptype: PacketType) -> Callable[[Reader, bool], Packet]:
    def decode_reason(r: Reader, v5: bool) -> Packet:
        if not v5:
            if ptype == _P.AUTH:
                raise MalformedPacket("packet type 15 is reserved in MQTT 3.1.1 [MQTT-2.2.1]")
            r.expect_end(ptype.name)
            return cls()
        code, props = 0, None
        if r.remaining():
            code = _reason(r, ptype)
            if r.remaining():
                props = decode_properties(r, ptype)
        r.expect_end(ptype.name)
        return cls(code, props or Properties())

    return decode_reason


_DECODERS: dict[int, Callable[[Reader, bool], Packet]] = {
    _P.CONNACK: _connack,
    _P.PUBACK: _ack(Puback, _P.PUBACK),
    _P.PUBREC: _ack(Pubrec, _P.PUBREC),
    _P.PUBREL: _ack(Pubrel, _P.PUBREL),
    _P.PUBCOMP: _ack(Pubcomp, _P.PUBCOMP),
    _P.SUBSCRIBE: _subscribe,
    _P.SUBACK: _suback,
    _P.UNSUBSCRIBE: _unsubscribe,
    _P.UNSUBACK: _unsuback,
    _P.PINGREQ: _empty(Pingreq),
    _P.PINGRESP: _empty(Pingresp),
    _P.DISCONNECT: _reason_only(Disconnect, _P.DISCONNECT),
    _P.AUTH: _reason_only(Auth, _P.AUTH),
}


class Decoder:
    """Turns a byte stream into packets; buffers partial packets. The version is learnt from CONNECT if not given."""

    __slots__ = ("_chunks", "_have", "_need", "max_packet_size", "protocol_version")

    def __init__(self, max_packet_size: int | None = None, protocol_version: int | None = None) -> None:
        self.max_packet_size = max_packet_size
        self.protocol_version = protocol_version
        self._chunks: list[bytes] = []  # unparsed bytes, joined lazily once `_need` bytes are there
        self._have = 0
        self._need = 0

    @property
    def buffered(self) -> int:
        """Bytes held from an incomplete packet."""
        return self._have if self._chunks else 0

    def feed(self, data: bytes) -> list[Packet]:
        """Add bytes; return every packet now complete. Raises MQTTError subclasses only."""
        if self._chunks:
            self._chunks.append(bytes(data))
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = b"".join(self._chunks)
        else:
            buf = bytes(data)
        out: list[Packet] = []
        try:
            pos = self._parse(buf, out)
        except MQTTError:
            raise
        except (IndexError, ValueError, struct.error) as exc:  # defence in depth: never leak a Python error
            raise MalformedPacket(f"malformed packet: {exc}") from exc
        rest = buf[pos:]
        self._chunks = [rest] if rest else []
        self._have = len(rest)
        return out

    def _parse(self, buf: bytes, out: list[Packet]) -> int:
        """Decode whole packets from `buf` into `out`; returns where the unparsed tail starts."""
        end = len(buf)
        pos = 0
        limit = self.max_packet_size
        while pos < end:
            first = buf[pos]
            # Remaining Length: up to four bytes [MQTT-2.1.4, MQTT-1.5.5-1].
            p = pos + 1
            if p < end and buf[p] < 128:  # one-byte Remaining Length: the common case
                remaining = buf[p]
                p += 1
            else:
                remaining, p = self._remaining_length(buf, pos, end)
                if p < 0:
                    return pos
            total = p - pos + remaining
            if limit is not None and total > limit:
                raise PacketTooLarge(f"packet of {total} bytes exceeds the maximum of {limit} [MQTT-3.2.2-15]")
            pend = p + remaining
            if pend > end:
                self._need = total
                return pos
            if first >> 4 == 3 and self.protocol_version is not None:
                out.append(self._publish(first, buf, p, pend, self.protocol_version == MQTT_5))
            elif remaining == 2 and first in _SHORT_ACKS and self.protocol_version is not None:
                packet_id = (buf[p] << 8) | buf[p + 1]  # the two-byte form of PUBACK..PUBCOMP [MQTT-3.4.2.1]
                if not packet_id:
                    raise ProtocolError("packet identifier 0 is invalid [MQTT-2.2.1-3]")
                out.append(_SHORT_ACKS[first](packet_id, _SUCCESS, NO_PROPERTIES))
            else:
                out.append(self._other(first, buf, p, pend))
            pos = pend
        self._need = 0
        return pos

    def _remaining_length(self, buf: bytes, pos: int, end: int) -> tuple[int, int]:
        """Remaining Length at pos+1 (up to four bytes [MQTT-2.1.4, MQTT-1.5.5-1]); p = -1 if more bytes are needed."""
        p = pos + 1
        remaining = 0
        shift = 0
        while True:
            if p >= end:
                self._need = p - pos + 1
                return 0, -1
            byte = buf[p]
            remaining |= (byte & 0x7F) << shift
            p += 1
            if not byte & 0x80:
                return remaining, p
            shift += 7
            if shift == 28:
                raise MalformedPacket("remaining length longer than four bytes [MQTT-1.5.5-1]")

    def _publish(self, first: int, buf: bytes, p: int, pend: int, v5: bool) -> Publish:
        """PUBLISH fast path: no Reader, no property machinery when the property length is 0."""
        qos = (first >> 1) & 3
        if qos == 3:
            raise MalformedPacket("PUBLISH QoS 3 [MQTT-3.3.1-4]")
        if first & 8 and not qos:
            raise MalformedPacket("DUP set on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
        if p + 2 > pend:
            raise MalformedPacket("PUBLISH too short for its topic length")
        tend = p + 2 + ((buf[p] << 8) | buf[p + 1])
        if tend > pend:
            raise MalformedPacket("PUBLISH topic runs past the end of the packet")
        if v5:
            after = tend + 2 if qos else tend
            if after >= pend or buf[after] != 0:  # properties present (or missing length): general path
                return _publish(first & 0x0F, Reader(buf, p, pend), True)
        try:
            topic = buf[p + 2 : tend].decode("utf-8")  # strict decoding rejects surrogates [MQTT-1.5.4-1]
        except UnicodeDecodeError as exc:
            raise MalformedPacket("ill-formed UTF-8 topic [MQTT-1.5.4-1]") from exc
        if "\x00" in topic:
            raise MalformedPacket("topic contains U+0000 [MQTT-1.5.4-2]")
        if "+" in topic or "#" in topic:
            raise ProtocolError("topic name contains a wildcard [MQTT-3.3.2-2]", ReasonCode.TOPIC_NAME_INVALID)
        if not topic:
            raise ProtocolError("empty topic name without a topic alias [MQTT-3.3.2-1, MQTT-4.7.3-1]",
                                ReasonCode.TOPIC_NAME_INVALID)
        if qos:
            if tend + 2 > pend:
                raise MalformedPacket("PUBLISH too short for its packet identifier")
            packet_id = (buf[tend] << 8) | buf[tend + 1]
            if not packet_id:
                raise ProtocolError("packet identifier 0 is invalid [MQTT-2.2.1-3]")
            start = tend + 2
        else:
            packet_id = None
            start = tend
        if v5:
            start += 1
        return Publish(topic, buf[start:pend], qos, bool(first & 1), bool(first & 8), packet_id, NO_PROPERTIES)

    def _other(self, first: int, buf: bytes, p: int, pend: int) -> Packet:
        """Decode any packet but a fast-path PUBLISH, checking the fixed-header flags [MQTT-2.1.3-1]."""
        ptype = first >> 4
        flags = first & 0x0F
        if ptype == 0:
            raise MalformedPacket("packet type 0 is reserved [MQTT-2.1.2]")
        if ptype != 3 and flags != _REQUIRED_FLAGS[ptype]:
            raise MalformedPacket(f"{_NAMES[ptype]} has invalid fixed-header flags {flags:#06b} [MQTT-2.1.3-1]")
        reader = Reader(buf, p, pend)
        if ptype == _P.CONNECT:
            return _connect(reader, self)
        version = self.protocol_version
        if version is None:
            raise ProtocolError(f"{_NAMES[ptype]} before CONNECT [MQTT-3.1.0-1]")
        if ptype == 3:
            return _publish(flags, reader, version == MQTT_5)
        return _DECODERS[ptype](reader, version == MQTT_5)
