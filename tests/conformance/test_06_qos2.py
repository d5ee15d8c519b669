"""Conformance 06: QoS 2 exactly-once in both directions [MQTT-4.3.3]."""

from __future__ import annotations

from appliance.protocol.packets import MQTT_5, Pubcomp, Publish, Pubrec, Pubrel
from appliance.protocol.reason_codes import ReasonCode


def test_inbound_qos2_resend_before_pubrel_is_not_delivered_twice(client, uid):  # [MQTT-4.3.3-10]
    sub = client()
    sub.connect(f"{uid}-s")
    sub.subscribe(f"{uid}/t", 2)
    pub = client()
    pub.connect(f"{uid}-p", clean=False)
    pub.publish(f"{uid}/t", b"once", 2, packet_id=9)
    assert pub.expect(Pubrec).packet_id == 9
    pub.publish(f"{uid}/t", b"once", 2, packet_id=9, dup=True)  # resent: PUBREC again, no second copy
    assert pub.expect(Pubrec).packet_id == 9
    pub.send(Pubrel(9))
    assert pub.expect(Pubcomp).packet_id == 9
    got = sub.expect(Publish)
    assert got.qos == 2 and got.payload == b"once"
    sub.send(Pubrec(got.packet_id))  # type: ignore[arg-type]
    assert sub.expect(Pubrel).packet_id == got.packet_id
    sub.send(Pubcomp(got.packet_id))  # type: ignore[arg-type]
    assert sub.quiet(0.4) == []


def test_pubrel_resent_after_reconnect_when_pubcomp_missing(client, uid):  # [MQTT-4.4.0-1]
    sub = client()
    sub.connect(f"{uid}-s", clean=False)
    sub.subscribe(f"{uid}/t", 2)
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/t", b"x", 2, packet_id=1)
    pub.expect(Pubrec)
    pub.send(Pubrel(1))
    pub.expect(Pubcomp)
    got = sub.expect(Publish)
    sub.send(Pubrec(got.packet_id))  # type: ignore[arg-type]
    sub.expect(Pubrel)
    sub.close()  # no PUBCOMP
    again = client()
    again.connect(f"{uid}-s", clean=False)
    rel = again.expect(Pubrel)  # the flow resumes at PUBREL, not a new PUBLISH
    assert rel.packet_id == got.packet_id
    again.send(Pubcomp(rel.packet_id))
    assert again.quiet(0.4) == []


def test_pubrel_for_unknown_packet_id_gets_0x92(client, uid):  # [MQTT-3.7.2.1]
    c = client(MQTT_5)
    c.connect(uid)
    c.send(Pubrel(77))
    assert c.expect(Pubcomp).reason_code == ReasonCode.PACKET_IDENTIFIER_NOT_FOUND
