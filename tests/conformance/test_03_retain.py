"""Conformance 03: retained messages [MQTT-3.3.1-5..13, 3.8.3.1 Retain Handling]."""

from __future__ import annotations

from appliance.protocol.packets import MQTT_5, Puback, Publish


def _retain(client, uid, topic: str, payload: bytes) -> None:
    pub = client()
    pub.connect(f"{uid}-rp")
    pub.publish(topic, payload, 1, packet_id=1, retain=True)
    pub.expect(Puback)
    pub.disconnect()


def test_retained_message_sent_on_subscribe_with_retain_flag(client, uid):  # [MQTT-3.3.1-6, 3.3.1-9]
    _retain(client, uid, f"{uid}/r", b"kept")
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/#", 1)
    got = sub.collect(1)[0]
    assert (got.payload, got.retain) == (b"kept", True)


def test_live_messages_have_retain_cleared_unless_retain_as_published(client, uid):  # [MQTT-3.3.1-12, 13]
    plain = client(MQTT_5)
    plain.connect(f"{uid}-a")
    plain.subscribe(f"{uid}/live", 0)
    rap = client(MQTT_5)
    rap.connect(f"{uid}-b")
    rap.subscribe(f"{uid}/live", 0, retain_as_published=True)
    _retain(client, uid, f"{uid}/live", b"now")
    assert plain.expect(Publish).retain is False
    assert rap.expect(Publish).retain is True


def test_empty_retained_payload_clears_it(client, uid):  # [MQTT-3.3.1-10, 3.3.1-11]
    _retain(client, uid, f"{uid}/c", b"first")
    _retain(client, uid, f"{uid}/c", b"")
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/c", 0)
    assert sub.quiet(0.4) == []


def test_retain_handling_1_only_new_and_2_never(client, uid):  # [MQTT-3.3.1-10 (v5), 3.8.3.1]
    _retain(client, uid, f"{uid}/h", b"r")
    c = client(MQTT_5)
    c.connect(f"{uid}-s")
    c.subscribe(f"{uid}/h", 0, packet_id=1, retain_handling=1)
    assert c.expect(Publish).payload == b"r"
    c.subscribe(f"{uid}/h", 0, packet_id=2, retain_handling=1)  # not new: nothing
    assert c.quiet(0.3) == []
    d = client(MQTT_5)
    d.connect(f"{uid}-n")
    d.subscribe(f"{uid}/h", 0, retain_handling=2)
    assert d.quiet(0.3) == []


def test_retained_qos_is_min_of_message_and_subscription(client, uid):  # [MQTT-3.8.4-8]
    _retain(client, uid, f"{uid}/q", b"q1")
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/q", 0)
    assert sub.expect(Publish).qos == 0
