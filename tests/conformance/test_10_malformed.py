"""Conformance 10: malformed input closes only the offending connection [MQTT-1.5, 2.1.3, 3.3.1-4, 4.13]."""

from __future__ import annotations

import pytest

from appliance.protocol.packets import MQTT_5, Disconnect, Publish
from appliance.protocol.reason_codes import ReasonCode


def _qos0_publish(topic: bytes, version: int) -> bytes:
    """A QoS0 PUBLISH with a raw (possibly invalid) topic and payload b"x"; v5 adds an empty property length."""
    body = len(topic).to_bytes(2, "big") + topic + (b"\x00" if version == MQTT_5 else b"") + b"x"
    return bytes([0x30, len(body)]) + body


CASES = {
    "remaining-length-5-bytes": lambda v: b"\x30\xff\xff\xff\xff\x01",  # [MQTT-1.5.5-1]
    "qos-3-publish": lambda v: b"\x36\x05\x00\x01a\x00\x01",  # [MQTT-3.3.1-4]
    "pubrel-bad-flags": lambda v: b"\x60\x02\x00\x01",  # [MQTT-2.1.3-1]
    "subscribe-bad-flags": lambda v: b"\x80\x06\x00\x01\x00\x01a\x00",  # [MQTT-2.1.3-1]
    "invalid-utf8-topic": lambda v: _qos0_publish(b"\xc3\x28", v),  # [MQTT-1.5.4-1]
    "nul-in-topic": lambda v: _qos0_publish(b"a\x00", v),  # [MQTT-1.5.4-2]
    "wildcard-in-topic-name": lambda v: _qos0_publish(b"a#", v),  # [MQTT-3.3.2-2]
    "subscribe-no-filters": lambda v: b"\x82\x02\x00\x01",  # [MQTT-3.8.3-3]
    "reserved-packet-type-0": lambda v: b"\x00\x00",  # [MQTT-2.1.2]
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("version", [4, MQTT_5], ids=["v311", "v5"])
def test_malformed_packet_closes_only_that_connection(client, uid, name, version):
    bystander = client()
    bystander.connect(f"{uid}-b")
    bystander.subscribe(f"{uid}/ok", 0)
    bad = client(version)
    bad.connect(f"{uid}-x")
    bad.send_bytes(CASES[name](version))
    got = bad.expect_closed()
    if version == MQTT_5:  # v5 gets a DISCONNECT with a reason code >= 0x80 first [MQTT-4.13.1-1]
        assert got and isinstance(got[-1], Disconnect) and got[-1].reason_code >= 0x80, got
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/ok", b"still here")
    assert bystander.expect(Publish).payload == b"still here"


def test_garbage_before_connect_is_closed(client):
    c = client()
    c.send_bytes(b"GET / HTTP/1.1\r\n\r\n")
    c.expect_closed()


def test_v5_malformed_reason_is_0x81(client, uid):
    c = client(MQTT_5)
    c.connect(uid)
    c.send_bytes(b"\x30\xff\xff\xff\xff\x01")
    got = c.expect_closed()
    assert got[-1].reason_code == ReasonCode.MALFORMED_PACKET
