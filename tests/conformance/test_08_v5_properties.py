"""Conformance 08: MQTT 5 properties end to end [MQTT-3.3.2.3]."""

from __future__ import annotations

import time

from appliance.protocol.packets import MQTT_5, Properties, Puback


def _pair(client, uid, qos=1, **sub_kw):
    sub = client(MQTT_5)
    sub.connect(f"{uid}-s", **sub_kw.pop("connect", {}))
    sub.subscribe(f"{uid}/#", qos, **sub_kw)
    pub = client(MQTT_5)
    pub.connect(f"{uid}-p")
    return sub, pub


def test_user_properties_forwarded_in_order(client, uid):  # [MQTT-3.3.2-17, 3.3.2-18]
    sub, pub = _pair(client, uid)
    props = Properties(user_properties=[("b", "2"), ("a", "1"), ("b", "3")])
    pub.publish(f"{uid}/t", b"x", 1, packet_id=1, properties=props)
    got = sub.collect(1)[0]
    assert got.properties.user_properties == [("b", "2"), ("a", "1"), ("b", "3")]


def test_request_response_properties_forwarded(client, uid):  # [MQTT-3.3.2-15, 3.3.2-16]
    sub, pub = _pair(client, uid)
    props = Properties(response_topic=f"{uid}/reply", correlation_data=b"\x01\x02", content_type="text/plain",
                       payload_format_indicator=1)
    pub.publish(f"{uid}/t", b"req", 1, packet_id=1, properties=props)
    got = sub.collect(1)[0].properties
    assert (got.response_topic, got.correlation_data, got.content_type, got.payload_format_indicator) == (
        f"{uid}/reply", b"\x01\x02", "text/plain", 1)


def test_subscription_identifier_returned_with_matching_publish(client, uid):  # [MQTT-3.8.2.1.2, 3.3.4-3]
    sub, pub = _pair(client, uid, properties=Properties(subscription_identifiers=[42]))
    pub.publish(f"{uid}/t", b"x", 1, packet_id=1)
    assert sub.collect(1)[0].properties.subscription_identifiers == [42]


def test_inbound_topic_alias_resolved(client, uid):  # [MQTT-3.3.2-12]
    sub, pub = _pair(client, uid)
    pub.publish(f"{uid}/aliased", b"first", 1, packet_id=1, properties=Properties(topic_alias=3))
    pub.publish("", b"second", 1, packet_id=2, properties=Properties(topic_alias=3))
    got = sub.collect(2)
    assert [(p.topic or "alias", p.payload) for p in got][1][1] == b"second"
    assert got[0].topic == f"{uid}/aliased"


def test_message_expiry_remaining_interval_and_drop(client, uid):  # [MQTT-3.3.2-5, 3.3.2-6]
    sub = client(MQTT_5)
    sub.connect(f"{uid}-s", clean=False, properties=Properties(session_expiry_interval=60))
    sub.subscribe(f"{uid}/#", 1)
    sub.disconnect()
    pub = client(MQTT_5)
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/short", b"dies", 1, packet_id=1, properties=Properties(message_expiry_interval=1))
    pub.publish(f"{uid}/long", b"lives", 1, packet_id=2, properties=Properties(message_expiry_interval=100))
    pub.expect(Puback)
    pub.expect(Puback)
    time.sleep(2.2)
    again = client(MQTT_5)
    again.connect(f"{uid}-s", clean=False, properties=Properties(session_expiry_interval=60))
    got = again.collect(1)
    assert got[0].payload == b"lives"
    assert 90 <= got[0].properties.message_expiry_interval < 100
    assert again.quiet(0.3) == []
