"""Decoded packets without properties share packets.NO_PROPERTIES, which must stay all-default."""

from __future__ import annotations

from appliance.protocol.connection import Connection
from appliance.protocol.packets import NO_PROPERTIES, Connack, Properties, Puback, Publish

CONNECT_311 = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
CONNECT_5 = b"\x10\x0e\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01c"


def _connected(connect: bytes) -> Connection:
    conn = Connection(topic_alias_maximum=4)
    conn.receive_data(connect)
    conn.send(Connack())
    return conn


def test_311_publish_and_short_ack_share_the_default_properties() -> None:
    conn = _connected(CONNECT_311)
    publish, ack = conn.receive_data(b"\x32\x08\x00\x01t\x00\x07abc" + b"\x40\x02\x00\x07")
    assert publish == Publish("t", b"abc", 1, False, False, 7)
    assert publish.properties is NO_PROPERTIES and ack.properties is NO_PROPERTIES  # type: ignore[union-attr]
    assert ack == Puback(7)
    assert Properties() == NO_PROPERTIES


def test_v5_publish_without_properties_shares_them_and_with_properties_does_not() -> None:
    conn = _connected(CONNECT_5)
    (plain,) = conn.receive_data(b"\x32\x09\x00\x01t\x00\x07\x00abc")
    assert plain.properties is NO_PROPERTIES  # type: ignore[union-attr]
    (aliased,) = conn.receive_data(b"\x32\x0c\x00\x01t\x00\x08\x03\x23\x00\x01abc")  # Topic Alias 1
    assert aliased.properties is not NO_PROPERTIES  # type: ignore[union-attr]
    assert Properties() == NO_PROPERTIES  # resolving the alias cleared it on the packet's own copy only
