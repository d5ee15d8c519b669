"""Conformance 04: will messages and will delay [MQTT-3.1.2-8..15, 3.1.3-9, 3.14.4-3]."""

from __future__ import annotations

import time

from appliance.protocol.packets import MQTT_5, Properties, Publish, Will


def _watcher(client, uid):
    w = client()
    w.connect(f"{uid}-w")
    w.subscribe(f"{uid}/will", 1)
    return w


def test_will_published_when_connection_drops(client, uid):  # [MQTT-3.1.2-8]
    w = _watcher(client, uid)
    c = client()
    c.connect(uid, will=Will(f"{uid}/will", b"gone", 1))
    c.close()
    got = w.collect(1)[0]
    assert got.payload == b"gone"


def test_no_will_after_normal_disconnect(client, uid):  # [MQTT-3.1.2-10]
    w = _watcher(client, uid)
    c = client()
    c.connect(uid, will=Will(f"{uid}/will", b"gone", 1))
    c.disconnect()
    assert w.quiet(0.5) == []


def test_disconnect_with_will_message_publishes_it(client, uid):  # [MQTT-3.14.2.1] reason 0x04
    w = _watcher(client, uid)
    c = client(MQTT_5)
    c.connect(uid, will=Will(f"{uid}/will", b"asked", 0))
    c.disconnect(0x04)
    assert w.collect(1)[0].payload == b"asked"


def test_will_delay_cancelled_by_reconnect(client, uid):  # [MQTT-3.1.3-9]
    w = _watcher(client, uid)
    will = Will(f"{uid}/will", b"late", 0, properties=Properties(will_delay_interval=2))
    c = client(MQTT_5)
    c.connect(uid, clean=False, will=will, properties=Properties(session_expiry_interval=60))
    c.close()
    again = client(MQTT_5)
    again.connect(uid, clean=False, properties=Properties(session_expiry_interval=60))
    assert w.quiet(3.0) == []


def test_will_delay_publishes_after_delay(client, uid):  # [MQTT-3.1.3-9]
    w = _watcher(client, uid)
    will = Will(f"{uid}/will", b"delayed", 0, properties=Properties(will_delay_interval=1))
    c = client(MQTT_5)
    c.connect(uid, clean=False, will=will, properties=Properties(session_expiry_interval=60))
    started = time.monotonic()
    c.close()
    assert w.quiet(0.3) == []  # not immediately
    got = w.expect(Publish, timeout=5)
    assert got.payload == b"delayed" and time.monotonic() - started >= 0.9
