"""Conformance 05: persistent sessions, clean start, expiry, redelivery [MQTT-3.1.2-4..6, 4.1, 4.4]."""

from __future__ import annotations

import time

from appliance.protocol.packets import MQTT_5, Properties, Puback


def _publish(client, uid, topic, payloads, qos=1):
    pub = client()
    pub.connect(f"{uid}-p")
    for i, payload in enumerate(payloads):
        pub.publish(topic, payload, qos, packet_id=i + 1 if qos else None)
        if qos:
            pub.expect(Puback)
    pub.disconnect()


def test_offline_messages_queued_for_persistent_session(client, uid):  # [MQTT-3.1.2-5, 3.2.2-2]
    s = client()
    s.connect(uid, clean=False)
    s.subscribe(f"{uid}/q", 1)
    s.disconnect()
    _publish(client, uid, f"{uid}/q", [b"a", b"b", b"c"])
    again = client()
    ack = again.connect(uid, clean=False)
    assert ack.session_present
    assert [p.payload for p in again.collect(3)] == [b"a", b"b", b"c"]


def test_clean_start_discards_the_session(client, uid):  # [MQTT-3.1.2-4]
    s = client()
    s.connect(uid, clean=False)
    s.subscribe(f"{uid}/q", 1)
    s.disconnect()
    fresh = client()
    assert fresh.connect(uid, clean=True).session_present is False
    fresh.disconnect()
    _publish(client, uid, f"{uid}/q", [b"x"])
    again = client()
    assert again.connect(uid, clean=False).session_present is False
    assert again.quiet(0.3) == []


def test_session_expiry_interval_ends_the_session(client, uid):  # [MQTT-3.1.2-23]
    s = client(MQTT_5)
    s.connect(uid, clean=True, properties=Properties(session_expiry_interval=1))
    s.subscribe(f"{uid}/q", 1)
    s.disconnect()
    time.sleep(2.5)  # the broker checks expiry once a second
    again = client(MQTT_5)
    assert again.connect(uid, clean=False, properties=Properties(session_expiry_interval=1)).session_present is False


def test_unacked_messages_redelivered_with_dup_on_reconnect(client, uid):  # [MQTT-4.4.0-1, MQTT-3.3.1-1]
    s = client()
    s.connect(uid, clean=False)
    s.subscribe(f"{uid}/r", 1)
    _publish(client, uid, f"{uid}/r", [b"one", b"two"])
    first = s.collect(2, auto_ack=False)
    assert all(not p.dup for p in first)
    s.close()
    again = client()
    again.connect(uid, clean=False)
    redelivered = again.collect(2)
    assert [p.payload for p in redelivered] == [b"one", b"two"]
    assert all(p.dup for p in redelivered)
    assert [p.packet_id for p in redelivered] == [p.packet_id for p in first]


def test_subscriptions_survive_a_broker_restart(ours, uid):  # [MQTT-4.1.0-1] durable session state
    from tests.support.raw import RawClient

    s = RawClient(ours.port)
    s.connect(uid, clean=False)
    s.subscribe(f"{uid}/restart", 1)
    s.disconnect()
    ours.restart()
    pub = RawClient(ours.port)
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/restart", b"after", 1, packet_id=1)
    pub.expect(Puback)
    again = RawClient(ours.port)
    assert again.connect(uid, clean=False).session_present
    assert again.collect(1)[0].payload == b"after"
    again.disconnect()
    pub.disconnect()


def test_acks_and_disconnect_in_one_read_lose_nothing(client, uid):  # [MQTT-4.3.2, 4.4.0-1]
    """PUBACKs that refill the inflight window arrive in the same read as DISCONNECT: the refill must stay queued."""
    from appliance.protocol.packets import Disconnect

    props = Properties(session_expiry_interval=300, receive_maximum=2)
    s = client(MQTT_5)
    s.connect(uid, clean=False, properties=props)
    s.subscribe(f"{uid}/w", 1)
    s.disconnect()
    _publish(client, uid, f"{uid}/w", [b"%d" % i for i in range(6)])
    first = client(MQTT_5)
    first.connect(uid, clean=False, properties=props)
    window = first.collect(2, auto_ack=False)
    first.send(*[Puback(p.packet_id) for p in window], Disconnect())  # type: ignore[arg-type]
    first.close()
    time.sleep(0.3)
    again = client(MQTT_5)
    again.connect(uid, clean=False, properties=props)
    rest = [p.payload for p in again.collect(4)]
    assert rest == [b"2", b"3", b"4", b"5"]
