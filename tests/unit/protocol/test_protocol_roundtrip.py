"""Round trips: encode then decode gives back the same packet, for every packet type and both versions."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocol import MQTT_5, MQTT_311, Decoder, encode

from .strategies import any_packet, packets

PACKETS = {v: packets(v) for v in (MQTT_311, MQTT_5)}
ANY = {v: any_packet(v) for v in (MQTT_311, MQTT_5)}
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CASES = [(v, name) for v in (MQTT_311, MQTT_5) for name in PACKETS[v]]


@pytest.mark.parametrize(("version", "name"), CASES, ids=[f"v{v}-{n}" for v, n in CASES])
@FAST
@given(data=st.data())
def test_roundtrip_every_packet_type(version, name, data):
    packet = data.draw(PACKETS[version][name])
    wire = encode(packet, version)
    assert Decoder(None, version).feed(wire) == [packet]


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@FAST
@given(data=st.data())
def test_connect_teaches_the_decoder_its_version(version, data):
    """Before CONNECT the version is unknown; CONNECT's protocol level sets it [MQTT-3.1.2-2]."""
    connect = data.draw(PACKETS[version]["CONNECT"])
    rest = data.draw(st.lists(ANY[version], max_size=4))
    decoder = Decoder()
    wire = encode(connect, version) + b"".join(encode(p, version) for p in rest)
    assert decoder.feed(wire) == [connect, *rest]
    assert decoder.protocol_version == version


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_partial_feeds_give_the_same_packets(version, data):
    """Byte-by-byte and randomly split feeds decode to exactly what one feed gives."""
    stream = data.draw(st.lists(ANY[version], min_size=1, max_size=5))
    wire = b"".join(encode(p, version) for p in stream)
    whole = Decoder(None, version).feed(wire)
    assert whole == stream
    byte_by_byte = Decoder(None, version)
    got = []
    for i in range(len(wire)):
        got += byte_by_byte.feed(wire[i : i + 1])
    assert got == stream
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    chunked = Decoder(None, version)
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += chunked.feed(wire[start:end])
    assert got == stream


def test_max_size_remaining_length_boundaries():
    """Remaining Length uses 1..4 bytes [MQTT-2.1.4]; payloads around each boundary survive a round trip."""
    from appliance.protocol import Publish

    for size in (0, 120, 121, 122, 16_370, 16_380, 16_400, 2_097_140, 2_097_160):
        packet = Publish("t", b"p" * size)
        assert Decoder(None, MQTT_311).feed(encode(packet, MQTT_311)) == [packet]


def test_large_packet_in_many_chunks_then_more_packets():
    """A 200 kB PUBLISH fed in 1000-byte chunks, with a PINGREQ glued to its tail, decodes once and in order."""
    from appliance.protocol import Pingreq, Publish

    big = Publish("big/topic", bytes(range(256)) * 800, 1, packet_id=42)
    wire = encode(big, MQTT_5) + encode(Pingreq(), MQTT_5)
    decoder = Decoder(None, MQTT_5)
    got = []
    for start in range(0, len(wire), 1000):
        got += decoder.feed(wire[start : start + 1000])
    assert got == [big, Pingreq()]
