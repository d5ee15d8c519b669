"""Conformance 02: subscribe / publish / matching / ordering [MQTT-3.3, 3.8, 4.6, 4.7]."""

from __future__ import annotations

from appliance.protocol.packets import MQTT_5, Puback, Publish, Unsuback, Unsubscribe
from appliance.protocol.reason_codes import ReasonCode


def test_wildcards_match_per_spec(client, uid):  # [MQTT-4.7.1-1..3]
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/+/b", 0, packet_id=1)
    sub.subscribe(f"{uid}/a/#", 0, packet_id=2)
    pub = client()
    pub.connect(f"{uid}-p")
    for topic in (f"{uid}/x/b", f"{uid}/a", f"{uid}/a/b/c", f"{uid}/x/c", f"{uid}/x/b/c"):
        pub.publish(topic, topic.encode())
    got = sorted(p.topic for p in sub.collect(3))
    assert got == sorted([f"{uid}/x/b", f"{uid}/a", f"{uid}/a/b/c"])
    assert sub.quiet(0.3) == []


def test_dollar_topics_not_matched_by_leading_wildcards(client, uid):  # [MQTT-4.7.2-1]
    sub = client()
    sub.connect(uid)
    sub.subscribe("#", 0)
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/visible", b"1")
    got = sub.collect(1)
    assert all(not p.topic.startswith("$") for p in got + [x for x in sub.quiet(0.3) if isinstance(x, Publish)])


def test_granted_qos_caps_delivery_qos(client, uid):  # [MQTT-3.8.4-8]
    sub = client()
    sub.connect(f"{uid}-s")
    assert sub.subscribe(f"{uid}/t", 0).reason_codes == [0]
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/t", b"q1", 1, packet_id=5)
    pub.expect(Puback)
    assert sub.expect(Publish).qos == 0


def test_overlapping_subscriptions_deliver_one_copy_at_highest_qos(client, uid):  # [MQTT-3.3.4-2]
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/#", 0, packet_id=1)
    sub.subscribe(f"{uid}/t", 1, packet_id=2)
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/t", b"once", 1, packet_id=1)
    got = sub.collect(1)
    assert got[0].qos == 1
    assert sub.quiet(0.3) == []


def test_no_local_suppresses_own_messages(client, uid):  # [MQTT-3.8.3-3]
    c = client(MQTT_5)
    c.connect(uid)
    c.subscribe(f"{uid}/t", 0, no_local=True)
    c.publish(f"{uid}/t", b"mine")
    other = client(MQTT_5)
    other.connect(f"{uid}-o")
    other.publish(f"{uid}/t", b"theirs")
    got = c.collect(1)
    assert [p.payload for p in got] == [b"theirs"]


def test_unsubscribe_stops_delivery_and_reports_missing_filters(client, uid):  # [MQTT-3.10.4-1, 3.11.3]
    c = client(MQTT_5)
    c.connect(uid)
    c.subscribe(f"{uid}/t", 0)
    c.send(Unsubscribe(7, [f"{uid}/t", f"{uid}/never"]))
    ack = c.expect(Unsuback)
    assert ack.packet_id == 7
    assert ack.reason_codes == [ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED]
    c.publish(f"{uid}/t", b"after")
    assert c.quiet(0.3) == []


def test_puback_0x10_when_no_subscriber_matches(client, uid):  # [MQTT-3.4.2.1]
    c = client(MQTT_5)
    c.connect(uid)
    c.publish(f"{uid}/nobody", b"x", 1, packet_id=3)
    assert c.expect(Puback).reason_code == ReasonCode.NO_MATCHING_SUBSCRIBERS


def test_messages_keep_publisher_order(client, uid):  # [MQTT-4.6.0-5]
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/t", 1)
    pub = client()
    pub.connect(f"{uid}-p")
    for i in range(200):
        pub.publish(f"{uid}/t", b"%d" % i, 1, packet_id=i + 1)
    got = [int(p.payload) for p in sub.collect(200)]
    assert got == list(range(200))


def test_invalid_filter_refused_in_suback(client, uid):  # [MQTT-4.7.1-2]
    c = client(MQTT_5)
    c.connect(uid)
    assert c.subscribe("a/#/b", 0).reason_codes == [ReasonCode.TOPIC_FILTER_INVALID]
    c3 = client()
    c3.connect(f"{uid}-3")
    assert c3.subscribe("a/b#", 0).reason_codes == [0x80]  # 3.1.1 failure code [MQTT-3.9.3]
