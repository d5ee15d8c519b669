"""Malformed input: a seed corpus of bad packets with their reason codes; fuzzing shows only MQTTError escapes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocol import (
    MQTT_5,
    MQTT_311,
    Decoder,
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    ReasonCode,
    UnsupportedProtocolVersion,
    encode,
)

from .strategies import any_packet

MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL = ReasonCode.PROTOCOL_ERROR


def frame(first: int, body: bytes) -> bytes:
    """A fixed header written by hand (one-byte remaining length), independent of the codec under test."""
    assert len(body) < 128
    return bytes((first, len(body))) + body


def s(text: bytes) -> bytes:
    return len(text).to_bytes(2, "big") + text


def connect(name: bytes = b"MQTT", level: int = 4, flags: int = 0x02, props: bytes | None = None,
            payload: bytes = b"\x00\x01c") -> bytes:
    """A CONNECT written by hand; `props` (v5) is the property block without its length byte."""
    body = s(name) + bytes((level, flags)) + b"\x00\x3c"
    if level == 5:
        body += bytes((len(props or b""),)) + (props or b"")
    return frame(0x10, body + payload)


def publish5(props: bytes, topic: bytes = b"a") -> bytes:
    return frame(0x30, s(topic) + bytes((len(props),)) + props)


# (id, version the decoder already knows or None, bytes, exception type, reason code)
CORPUS = [
    ("type-0-reserved-MQTT-2.1.2", 4, b"\x00\x00", MalformedPacket, MALFORMED),
    ("pubrel-flags-MQTT-2.1.3-1", 4, b"\x60\x02\x00\x01", MalformedPacket, MALFORMED),
    ("subscribe-flags-MQTT-2.1.3-1", 4, frame(0x80, b"\x00\x01" + s(b"a") + b"\x00"), MalformedPacket, MALFORMED),
    ("unsubscribe-flags-MQTT-2.1.3-1", 4, frame(0xA0, b"\x00\x01" + s(b"a")), MalformedPacket, MALFORMED),
    ("pingreq-flags-MQTT-2.1.3-1", 4, b"\xc1\x00", MalformedPacket, MALFORMED),
    ("remaining-length-5-bytes-MQTT-1.5.5-1", 4, b"\x30\xff\xff\xff\xff\x01", MalformedPacket, MALFORMED),
    ("pingreq-trailing-byte", 4, b"\xc0\x01\x00", MalformedPacket, MALFORMED),
    ("auth-in-311-MQTT-2.2.1", 4, b"\xf0\x00", MalformedPacket, MALFORMED),
    ("publish-qos3-MQTT-3.3.1-4", 4, frame(0x36, s(b"a") + b"\x00\x01"), MalformedPacket, MALFORMED),
    ("publish-dup-qos0-MQTT-3.3.1-2", 4, frame(0x38, s(b"a")), MalformedPacket, MALFORMED),
    ("publish-dup-qos0-v5-MQTT-3.3.1-2", 5, frame(0x38, s(b"a") + b"\x00"), MalformedPacket, MALFORMED),
    ("publish-packet-id-0-MQTT-2.2.1-3", 4, frame(0x32, s(b"a") + b"\x00\x00"), ProtocolError, PROTOCOL),
    ("publish-wildcard-topic-MQTT-3.3.2-2", 4, frame(0x30, s(b"a/+")), ProtocolError,
     ReasonCode.TOPIC_NAME_INVALID),
    ("publish-hash-topic-v5-MQTT-3.3.2-2", 5, frame(0x30, s(b"#") + b"\x00"), ProtocolError,
     ReasonCode.TOPIC_NAME_INVALID),
    ("publish-nul-in-topic-MQTT-1.5.4-2", 4, frame(0x30, s(b"a\x00b")), MalformedPacket, MALFORMED),
    ("publish-surrogate-topic-MQTT-1.5.4-1", 4, frame(0x30, s(b"\xed\xa0\x80")), MalformedPacket, MALFORMED),
    ("publish-invalid-utf8-topic-MQTT-1.5.4-1", 5, frame(0x30, s(b"\xc0\xaf") + b"\x00"), MalformedPacket, MALFORMED),
    ("publish-topic-past-end", 4, frame(0x30, b"\x00\x05a"), MalformedPacket, MALFORMED),
    ("publish-no-packet-id", 4, frame(0x32, s(b"a") + b"\x00"), MalformedPacket, MALFORMED),
    ("publish-empty-topic-311-MQTT-4.7.3-1", 4, frame(0x30, s(b"")), ProtocolError, ReasonCode.TOPIC_NAME_INVALID),
    ("publish-empty-topic-no-alias-v5-MQTT-3.3.2-1", 5, frame(0x30, s(b"") + b"\x00"), ProtocolError,
     ReasonCode.TOPIC_NAME_INVALID),
    ("publish-v5-missing-property-length", 5, frame(0x30, s(b"a")), MalformedPacket, MALFORMED),
    ("publish-v5-property-length-past-end", 5, frame(0x30, s(b"a") + b"\x05\x01"), MalformedPacket, MALFORMED),
    ("publish-v5-duplicate-expiry", 5, publish5(b"\x02\x00\x00\x00\x01" * 2), ProtocolError, PROTOCOL),
    ("publish-v5-session-expiry-not-allowed-MQTT-2.2.2.2", 5, publish5(b"\x11\x00\x00\x00\x01"), MalformedPacket,
     MALFORMED),
    ("publish-v5-unknown-property-MQTT-2.2.2.2", 5, publish5(b"\x7f\x00"), MalformedPacket, MALFORMED),
    ("publish-v5-subscription-id-0", 5, publish5(b"\x0b\x00"), ProtocolError, PROTOCOL),
    ("publish-v5-subscription-id-5-byte-varint-MQTT-1.5.5-1", 5, publish5(b"\x0b\xff\xff\xff\xff\x01"),
     MalformedPacket, MALFORMED),
    ("publish-v5-payload-format-2", 5, publish5(b"\x01\x02"), ProtocolError, PROTOCOL),
    ("publish-v5-user-property-bad-utf8-MQTT-1.5.4-1", 5, publish5(b"\x26" + s(b"\xff") + s(b"v")), MalformedPacket,
     MALFORMED),
    ("publish-v5-truncated-u32-property", 5, publish5(b"\x02\x00\x00"), MalformedPacket, MALFORMED),
    ("connect-level-3-MQTT-3.1.2-2", None, connect(b"MQIsdp", 3), UnsupportedProtocolVersion,
     ReasonCode.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect-level-6-MQTT-3.1.2-2", None, connect(level=6), UnsupportedProtocolVersion,
     ReasonCode.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect-bad-protocol-name-MQTT-3.1.2-1", None, connect(b"MQTX"), UnsupportedProtocolVersion,
     ReasonCode.UNSUPPORTED_PROTOCOL_VERSION),
    ("connect-reserved-flag-MQTT-3.1.2-3", None, connect(flags=0x03), MalformedPacket, MALFORMED),
    ("connect-will-qos-without-will-MQTT-3.1.2-13", None, connect(flags=0x0A), MalformedPacket, MALFORMED),
    ("connect-will-retain-without-will-MQTT-3.1.2-15", None, connect(flags=0x22), MalformedPacket, MALFORMED),
    ("connect-v5-will-qos-without-will-MQTT-3.1.2-11", None, connect(level=5, flags=0x0A), MalformedPacket,
     MALFORMED),
    ("connect-will-qos-3-MQTT-3.1.2-14", None, connect(flags=0x1E, payload=s(b"c") + s(b"t") + s(b"m")),
     MalformedPacket, MALFORMED),
    ("connect-311-password-without-username-MQTT-3.1.2-22", None, connect(flags=0x42, payload=s(b"c") + s(b"pw")),
     MalformedPacket, MALFORMED),
    ("connect-will-wildcard-topic-MQTT-3.1.2-9", None, connect(flags=0x06, payload=s(b"c") + s(b"a/#") + s(b"m")),
     ProtocolError, ReasonCode.TOPIC_NAME_INVALID),
    ("connect-v5-receive-maximum-0", None, connect(level=5, props=b"\x21\x00\x00"), ProtocolError, PROTOCOL),
    ("connect-v5-maximum-packet-size-0", None, connect(level=5, props=b"\x27\x00\x00\x00\x00"), ProtocolError,
     PROTOCOL),
    ("connect-v5-request-problem-info-2", None, connect(level=5, props=b"\x17\x02"), ProtocolError, PROTOCOL),
    ("connect-v5-topic-alias-not-allowed", None, connect(level=5, props=b"\x23\x00\x01"), MalformedPacket, MALFORMED),
    ("connect-trailing-byte", None, connect(payload=s(b"c") + b"\x00"), MalformedPacket, MALFORMED),
    ("connect-truncated", None, frame(0x10, s(b"MQTT") + b"\x04"), MalformedPacket, MALFORMED),
    ("first-packet-not-connect-MQTT-3.1.0-1", None, b"\xc0\x00", ProtocolError, PROTOCOL),
    ("subscribe-no-filter-MQTT-3.8.3-3", 4, frame(0x82, b"\x00\x01"), ProtocolError, PROTOCOL),
    ("subscribe-v5-no-filter-MQTT-3.8.3-3", 5, frame(0x82, b"\x00\x01\x00"), ProtocolError, PROTOCOL),
    ("subscribe-311-reserved-option-bits-MQTT-3.8.3-4", 4, frame(0x82, b"\x00\x01" + s(b"a") + b"\x04"),
     MalformedPacket, MALFORMED),
    ("subscribe-v5-reserved-option-bits-MQTT-3.8.3-5", 5, frame(0x82, b"\x00\x01\x00" + s(b"a") + b"\x40"),
     MalformedPacket, MALFORMED),
    ("subscribe-v5-retain-handling-3", 5, frame(0x82, b"\x00\x01\x00" + s(b"a") + b"\x30"), ProtocolError, PROTOCOL),
    ("subscribe-qos-3", 4, frame(0x82, b"\x00\x01" + s(b"a") + b"\x03"), MalformedPacket, MALFORMED),
    ("subscribe-v5-no-local-shared-MQTT-3.8.3-4", 5, frame(0x82, b"\x00\x01\x00" + s(b"$share/g/a") + b"\x04"),
     ProtocolError, PROTOCOL),
    ("subscribe-v5-subscription-id-0", 5, frame(0x82, b"\x00\x01\x02\x0b\x00" + s(b"a") + b"\x00"), ProtocolError,
     PROTOCOL),
    ("subscribe-v5-two-subscription-ids", 5, frame(0x82, b"\x00\x01\x04\x0b\x01\x0b\x02" + s(b"a") + b"\x00"),
     ProtocolError, PROTOCOL),
    ("subscribe-packet-id-0-MQTT-2.2.1-3", 4, frame(0x82, b"\x00\x00" + s(b"a") + b"\x00"), ProtocolError, PROTOCOL),
    ("subscribe-filter-without-options", 4, frame(0x82, b"\x00\x01" + s(b"a")), MalformedPacket, MALFORMED),
    ("unsubscribe-no-filter-MQTT-3.10.3-2", 4, frame(0xA2, b"\x00\x01"), ProtocolError, PROTOCOL),
    ("puback-packet-id-0-MQTT-2.2.1-3", 4, b"\x40\x02\x00\x00", ProtocolError, PROTOCOL),
    ("puback-311-trailing-byte", 4, b"\x40\x03\x00\x01\x00", MalformedPacket, MALFORMED),
    ("puback-v5-invalid-reason-code", 5, b"\x40\x03\x00\x01\x05", MalformedPacket, MALFORMED),
    ("pubrel-v5-invalid-reason-code", 5, b"\x62\x03\x00\x01\x10", MalformedPacket, MALFORMED),
    ("connack-reserved-flags-MQTT-3.2.2-1", 4, b"\x20\x02\x02\x00", MalformedPacket, MALFORMED),
    ("connack-311-reserved-return-code", 4, b"\x20\x02\x00\x06", MalformedPacket, MALFORMED),
    ("disconnect-311-with-body", 4, b"\xe0\x01\x00", MalformedPacket, MALFORMED),
    ("disconnect-v5-invalid-reason-code", 5, b"\xe0\x01\x01", MalformedPacket, MALFORMED),
    ("suback-311-invalid-code", 4, b"\x90\x03\x00\x01\x03", MalformedPacket, MALFORMED),
    ("unsuback-v5-no-codes", 5, b"\xb0\x03\x00\x01\x00", MalformedPacket, MALFORMED),
    ("auth-v5-invalid-reason-code", 5, b"\xf0\x01\x01", MalformedPacket, MALFORMED),
]


@pytest.mark.parametrize(("version", "data", "exc", "code"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_seed_corpus_raises_with_reason_code(version, data, exc, code):
    with pytest.raises(exc) as info:
        Decoder(None, version).feed(data)
    assert info.value.reason_code == code


@pytest.mark.parametrize(("version", "data", "exc", "code"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_seed_corpus_byte_by_byte_raises_the_same(version, data, exc, code):
    decoder = Decoder(None, version)
    with pytest.raises(exc) as info:
        for i in range(len(data)):
            decoder.feed(data[i : i + 1])
    assert info.value.reason_code == code


def test_too_large_is_detected_from_the_fixed_header_alone():
    """A packet over Maximum Packet Size is refused before its body is buffered [MQTT-3.2.2-15, MQTT-3.1.2-24]."""
    decoder = Decoder(max_packet_size=1000, protocol_version=MQTT_311)
    with pytest.raises(PacketTooLarge) as info:
        decoder.feed(b"\x30\xe8\x07")  # remaining length 1000 -> 1003 bytes in all
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE
    at_limit = encode_publish_of_total_size(1000)
    assert len(Decoder(max_packet_size=1000, protocol_version=MQTT_311).feed(at_limit)) == 1


def encode_publish_of_total_size(total: int) -> bytes:
    from appliance.protocol import Publish

    data = encode(Publish("t", b"x" * (total - 3 - 3)), MQTT_311)  # header 3 bytes, topic 3 bytes
    assert len(data) == total
    return data


def test_remaining_length_must_use_at_most_four_bytes_even_when_split():
    """[MQTT-1.5.5-1] is detected as soon as the fifth length byte arrives."""
    decoder = Decoder(None, MQTT_311)
    assert decoder.feed(b"\x30\x80\x80\x80") == []
    with pytest.raises(MalformedPacket):
        decoder.feed(b"\x80")


def test_utf8_bom_is_kept_not_stripped():
    """U+FEFF in a string is a character, not a byte-order mark to skip [MQTT-1.5.4-3]."""
    [packet] = Decoder(None, MQTT_311).feed(frame(0x30, s("\ufeffa".encode())))
    assert packet.topic == "\ufeffa"


def _only_mqtt_errors(decoder: Decoder, data: bytes) -> None:
    try:
        decoder.feed(data)
    except MQTTError:
        pass


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64), version=st.sampled_from([None, MQTT_311, MQTT_5]),
       limit=st.none() | st.integers(2, 64))
def test_random_bytes_raise_only_mqtt_errors(data, version, limit):
    _only_mqtt_errors(Decoder(limit, version), data)


_ANY = {v: any_packet(v) for v in (MQTT_311, MQTT_5)}
_MUTATION = st.tuples(st.sampled_from(["flip", "insert", "delete", "set"]), st.integers(0, 10_000),
                      st.integers(0, 255))


def mutate(wire: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(wire)
    for kind, where, value in mutations:
        i = where % (len(buf) + 1)
        if kind == "insert":
            buf.insert(i, value)
        elif buf and i < len(buf):
            if kind == "flip":
                buf[i] ^= 1 << (value % 8)
            elif kind == "delete":
                del buf[i]
            else:
                buf[i] = value
    return bytes(buf)


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_valid_packets_raise_only_mqtt_errors(version, data):
    stream = data.draw(st.lists(_ANY[version], min_size=1, max_size=3))
    wire = b"".join(encode(p, version) for p in stream)
    bad = mutate(wire, data.draw(st.lists(_MUTATION, min_size=1, max_size=3)))
    _only_mqtt_errors(Decoder(None, version), bad)
    split = data.draw(st.integers(0, len(bad)))
    decoder = Decoder(None, version)
    try:
        decoder.feed(bad[:split])
        decoder.feed(bad[split:])
    except MQTTError:
        pass
