"""Data representations [MQTT-1.5] and topic rules [MQTT-4.7, MQTT-4.8.2]."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.protocol import (
    MalformedPacket,
    ProtocolError,
    ReasonCode,
    SharedFilter,
    is_valid_topic_filter,
    is_valid_topic_name,
    parse_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)
from appliance.protocol.primitives import Reader, check_utf8, decode_varint, encode_utf8, encode_varint

# The spec's table 1-1 of Variable Byte Integer sizes [MQTT-1.5.5].
VARINTS = [
    (0, "00"), (127, "7f"), (128, "8001"), (16_383, "ff7f"), (16_384, "808001"), (2_097_151, "ffff7f"),
    (2_097_152, "80808001"), (268_435_455, "ffffff7f"),
]


@pytest.mark.parametrize(("value", "wire"), VARINTS)
def test_varint_matches_spec_table_MQTT_1_5_5(value, wire):
    assert encode_varint(value).hex() == wire
    assert decode_varint(bytes.fromhex(wire), 0, len(wire) // 2) == (value, len(wire) // 2)


@pytest.mark.parametrize("value", [-1, 268_435_456])
def test_varint_out_of_range_is_refused(value):
    with pytest.raises(MalformedPacket):
        encode_varint(value)


def test_varint_of_five_bytes_is_malformed_MQTT_1_5_5_1():
    with pytest.raises(MalformedPacket):
        decode_varint(b"\x80\x80\x80\x80\x01", 0, 5)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 268_435_455))
def test_varint_round_trip(value):
    wire = encode_varint(value)
    assert decode_varint(wire, 0, len(wire)) == (value, len(wire))


@pytest.mark.parametrize("raw", [b"\xc0\x80", b"\xed\xa0\x80", b"\xff", b"a\x00b", b"\xe2\x82"],
                         ids=["overlong-nul", "surrogate", "invalid-byte", "nul", "truncated"])
def test_ill_formed_utf8_is_malformed_MQTT_1_5_4_1_and_2(raw):
    with pytest.raises(MalformedPacket):
        check_utf8(raw)


@pytest.mark.parametrize("text", ["a\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_encoder_refuses_what_the_spec_forbids_MQTT_1_5_4_1_and_2(text):
    with pytest.raises(MalformedPacket):
        encode_utf8(text)


def test_string_longer_than_65535_bytes_is_refused():
    with pytest.raises(MalformedPacket):
        encode_utf8("é" * 40_000)


def test_reader_overrun_is_malformed_not_index_error():
    reader = Reader(b"\x00\x05abc", 0, 5)
    with pytest.raises(MalformedPacket):
        reader.utf8()


# ---- topics ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("topic", ["a", "/", "a/b", "//", "$SYS/x", " ", "a b/\u00e9", "\ufeff"])
def test_valid_topic_names(topic):
    validate_topic_name(topic)
    assert is_valid_topic_name(topic)


@pytest.mark.parametrize("topic", ["", "a/+", "#", "a/#", "+", "a+b", "a\x00b", "x" * 65_536],
                         ids=["empty", "plus", "hash", "hash-level", "plus-only", "plus-inside", "nul", "too-long"])
def test_invalid_topic_names_MQTT_4_7_3_1_and_3_3_2_2(topic):
    with pytest.raises(ProtocolError) as info:
        validate_topic_name(topic)
    assert info.value.reason_code == ReasonCode.TOPIC_NAME_INVALID
    assert not is_valid_topic_name(topic)


@pytest.mark.parametrize("topic_filter", ["#", "+", "a/#", "a/+/b", "+/+", "/+", "a//b", "+/#", "$SYS/#",
                                          "sport/tennis/+"])
def test_valid_topic_filters(topic_filter):
    assert validate_topic_filter(topic_filter) is None
    assert is_valid_topic_filter(topic_filter)


@pytest.mark.parametrize("topic_filter", ["", "a#", "a/#/b", "#/", "a/b#", "a+", "a/+b", "++", "a\x00"],
                         ids=["empty", "hash-glued", "hash-not-last", "hash-then-slash", "hash-in-level",
                              "plus-glued", "plus-in-level", "double-plus", "nul"])
def test_invalid_topic_filters_MQTT_4_7_1_1_to_3(topic_filter):
    with pytest.raises(ProtocolError) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


@pytest.mark.parametrize(("topic_filter", "expected"), [
    ("$share/g/a/b", SharedFilter("g", "a/b")),
    ("$share/group1/#", SharedFilter("group1", "#")),
    ("$share/g/+/x", SharedFilter("g", "+/x")),
    ("$share/g//", SharedFilter("g", "/")),
    ("a/b", None),
    ("$shared/g/a", None),
])
def test_parse_shared_subscriptions_MQTT_4_8_2(topic_filter, expected):
    assert parse_shared(topic_filter) == expected
    assert validate_topic_filter(topic_filter) == expected


@pytest.mark.parametrize("topic_filter", ["$share/", "$share/g", "$share/g/", "$share//a", "$share/g+/a",
                                          "$share/#/a", "$share/g/a#"],
                         ids=["no-group", "no-filter", "empty-filter", "empty-group", "plus-in-group",
                              "hash-group", "bad-inner"])
def test_invalid_shared_subscriptions_MQTT_4_8_2_1_and_2(topic_filter):
    with pytest.raises(ProtocolError):
        validate_topic_filter(topic_filter)


# The spec's own examples in 4.7.1.2, 4.7.1.3 and 4.7.2.
MATCHES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("sport/+/player1", "sport/tennis/player1", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/c", False),
    ("a/b", "A/b", False),
    ("a/+/c", "a/b/d", False),
    ("a/#", "b", False),
    ("a/b/c/d", "a/b", False),
]
DOLLAR = [
    ("#", "$SYS/broker/uptime", False),  # [MQTT-4.7.2-1]
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),  # [MQTT-4.7.2-1]
    ("+", "$SYS", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS", "$SYS", True),
    ("a/#", "a/$x", True),  # only a leading wildcard skips `$`
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES + DOLLAR)
def test_topic_matches_spec_examples_MQTT_4_7(topic_filter, topic, expected):
    assert topic_matches(topic_filter, topic) is expected


_level = st.text(st.sampled_from("ab$"), min_size=0, max_size=3)


@settings(max_examples=100, deadline=None)
@given(levels=st.lists(_level, min_size=1, max_size=5), data=st.data())
def test_wildcards_derived_from_a_topic_match_it(levels, data):
    """Replacing levels by '+' or a tail by '#' still matches, except leading wildcards on `$` topics."""
    topic = "/".join(levels)
    if not topic:
        return
    plus_at = data.draw(st.sets(st.integers(0, len(levels) - 1)))
    cut = data.draw(st.integers(0, len(levels)))
    pattern = ["+" if i in plus_at else lvl for i, lvl in enumerate(levels)]
    topic_filter = "/".join([*pattern[:cut], "#"])
    expected_plus = not (topic.startswith("$") and 0 in plus_at)
    expected_hash = expected_plus and not (topic.startswith("$") and cut == 0)
    assert topic_matches("/".join(pattern), topic) is expected_plus
    assert topic_matches(topic_filter, topic) is expected_hash
