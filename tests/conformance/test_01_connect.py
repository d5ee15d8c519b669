"""Conformance 01: CONNECT / CONNACK / session takeover / keep alive [MQTT-3.1, 3.2]."""

from __future__ import annotations

from appliance.protocol.packets import MQTT_5, Connack, Disconnect, Properties, Publish
from appliance.protocol.reason_codes import ReasonCode


def test_connack_success_v311_and_v5(client, uid):  # [MQTT-3.2.0-1]
    for version in (4, MQTT_5):
        c = client(version)
        ack = c.connect(f"{uid}-{version}")
        assert ack.reason_code == 0 and not ack.session_present


def test_first_packet_must_be_connect(client, uid):  # [MQTT-3.1.0-1]
    c = client()
    c.publish("x/y", b"early")
    c.expect_closed()


def test_second_connect_is_a_protocol_error(client, uid):  # [MQTT-3.1.0-2]
    from appliance.protocol.packets import Connect

    c = client(MQTT_5)
    c.connect(uid)
    c.send(Connect(uid, MQTT_5))
    got = c.expect_closed()
    assert any(isinstance(p, Disconnect) and p.reason_code == ReasonCode.PROTOCOL_ERROR for p in got)


def test_unsupported_protocol_level_gets_connack_0x01(client):  # [MQTT-3.1.2-2]
    c = client()
    # CONNECT with protocol level 6: fixed header, "MQTT", level 6, flags clean, keepalive 60, client id "x"
    c.send_bytes(b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x3c\x00\x01x")
    c.decoder.protocol_version = 4
    got = c.expect_closed()
    assert any(isinstance(p, Connack) and p.reason_code != 0 for p in got), got


def test_empty_client_id_without_clean_session_is_refused(client):  # [MQTT-3.1.3-8]
    c = client()
    got = c.connect("", clean=False)
    assert got.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID  # 3.1.1 return code 0x02 on the wire
    c.expect_closed()


def test_empty_client_id_v5_gets_an_assigned_identifier(client):  # [MQTT-3.1.3-6, MQTT-3.2.2-16]
    c = client(MQTT_5)
    ack = c.connect("")
    assert ack.reason_code == 0
    assigned = ack.properties.assigned_client_identifier
    assert assigned
    c.subscribe(f"{assigned}/t", 0)  # the session works under the assigned id
    c.publish(f"{assigned}/t", b"hi")
    assert c.expect(Publish).payload == b"hi"


def test_session_takeover_disconnects_old_connection_with_0x8e(client, uid):  # [MQTT-3.1.4-3]
    old = client(MQTT_5)
    old.connect(uid)
    new = client(MQTT_5)
    assert new.connect(uid).reason_code == 0
    got = old.expect_closed()
    assert any(isinstance(p, Disconnect) and p.reason_code == ReasonCode.SESSION_TAKEN_OVER for p in got), got


def test_keepalive_timeout_closes_the_connection(client, uid):  # [MQTT-3.1.2-22]: 1.5 x keep alive
    c = client()
    c.connect(uid, keepalive=1)
    c.expect_closed(timeout=6)


def test_pingreq_gets_pingresp(client, uid):  # [MQTT-3.12.4-1]
    from appliance.protocol.packets import Pingreq, Pingresp

    c = client()
    c.connect(uid)
    c.send(Pingreq())
    c.expect(Pingresp)


def test_v5_connack_announces_limits(client, uid):  # [MQTT-3.2.2.3]
    c = client(MQTT_5)
    ack = c.connect(uid, properties=Properties(session_expiry_interval=30))
    props = ack.properties
    assert props.receive_maximum and props.maximum_packet_size and props.topic_alias_maximum
