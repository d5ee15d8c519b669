"""Conformance 07: shared subscriptions [MQTT-4.8.2]."""

from __future__ import annotations

from appliance.protocol.packets import MQTT_5, Puback, Publish


def test_each_message_goes_to_exactly_one_group_member(client, uid):  # [MQTT-4.8.2-?]: one member per message
    members = []
    for i in range(2):
        m = client(MQTT_5)
        m.connect(f"{uid}-m{i}")
        m.subscribe(f"$share/g/{uid}/jobs", 1)
        members.append(m)
    pub = client(MQTT_5)
    pub.connect(f"{uid}-p")
    for i in range(20):
        pub.publish(f"{uid}/jobs", b"%d" % i, 1, packet_id=i + 1)
        pub.expect(Puback)
    got = []
    for m in members:
        got.append([p.payload for p in m.quiet(1.0) if isinstance(p, Publish)])
    assert all(got), f"round robin should reach both members: {got}"
    assert sorted(got[0] + got[1], key=int) == [b"%d" % i for i in range(20)]


def test_shared_subscription_gets_no_retained_messages(client, uid):  # [MQTT-3.8.4-? retained not sent to shares]
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/r", b"kept", 1, packet_id=1, retain=True)
    pub.expect(Puback)
    m = client(MQTT_5)
    m.connect(f"{uid}-m")
    m.subscribe(f"$share/g/{uid}/r", 1)
    assert m.quiet(0.4) == []


def test_shared_and_plain_subscriptions_both_receive(client, uid):  # [MQTT-4.8.2]
    shared = client(MQTT_5)
    shared.connect(f"{uid}-s")
    shared.subscribe(f"$share/g/{uid}/t", 0)
    plain = client(MQTT_5)
    plain.connect(f"{uid}-n")
    plain.subscribe(f"{uid}/t", 0)
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/t", b"both")
    assert shared.expect(Publish).payload == b"both"
    assert plain.expect(Publish).payload == b"both"
