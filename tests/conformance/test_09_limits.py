"""Conformance 09: configured limits and their policies [MQTT-3.1.2-24, 3.2.2-15, 3.3.4-9]."""

from __future__ import annotations

from pathlib import Path

from appliance.protocol.packets import MQTT_5, Disconnect, Properties, Puback, Publish
from appliance.protocol.reason_codes import ReasonCode
from tests.conformance.conftest import broker_with
from tests.support.raw import RawClient


def test_packet_larger_than_maximum_gets_disconnect_0x95(tmp_path: Path):  # [MQTT-3.2.2-15]
    with broker_with(tmp_path, "[limits]\nmax_packet_size = 1024\n") as b:
        c = RawClient(b.port, MQTT_5)
        assert c.connect("big").properties.maximum_packet_size == 1024
        c.publish("t", b"x" * 2000, 0)
        got = c.expect_closed()
        assert any(isinstance(p, Disconnect) and p.reason_code == ReasonCode.PACKET_TOO_LARGE for p in got)
        other = RawClient(b.port, MQTT_5)  # the broker still serves others
        assert other.connect("ok").reason_code == 0


def test_message_over_client_maximum_is_not_sent(client, uid):  # [MQTT-3.1.2-25]
    sub = client(MQTT_5)
    sub.connect(f"{uid}-s", properties=Properties(maximum_packet_size=200))
    sub.subscribe(f"{uid}/t", 0)
    pub = client()
    pub.connect(f"{uid}-p")
    pub.publish(f"{uid}/t", b"y" * 500)
    pub.publish(f"{uid}/t", b"small")
    got = [p.payload for p in sub.collect(1)]
    assert got == [b"small"]


def test_receive_maximum_exceeded_disconnects_0x93(tmp_path: Path):  # [MQTT-3.3.4-9]
    with broker_with(tmp_path, "[limits]\nreceive_maximum = 2\n") as b:
        c = RawClient(b.port, MQTT_5)
        assert c.connect("rm").properties.receive_maximum == 2
        c.send(*[Publish("rm/t", b"x", 2, packet_id=i) for i in (1, 2, 3)])  # QoS2 never completed: 3 open
        got = c.expect_closed()
        assert any(isinstance(p, Disconnect) and p.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED for p in got)


def test_queue_full_drop_oldest(tmp_path: Path):
    with broker_with(tmp_path, '[limits]\nmax_queued_messages = 3\nqueue_full_policy = "drop-oldest"\n') as b:
        s = RawClient(b.port)
        s.connect("q", clean=False)
        s.subscribe("q/t", 1)
        s.disconnect()
        p = RawClient(b.port)
        p.connect("qp")
        for i in range(6):
            p.publish("q/t", b"%d" % i, 1, packet_id=i + 1)
            p.expect(Puback)
        again = RawClient(b.port)
        again.connect("q", clean=False)
        assert [m.payload for m in again.collect(3)] == [b"3", b"4", b"5"]
        assert again.quiet(0.3) == []


def test_queue_full_refuse_answers_0x97(tmp_path: Path):
    with broker_with(tmp_path, '[limits]\nmax_queued_messages = 2\nqueue_full_policy = "refuse"\n') as b:
        s = RawClient(b.port, MQTT_5)
        s.connect("r", clean=False, properties=Properties(session_expiry_interval=600))
        s.subscribe("r/t", 1)
        s.disconnect()
        p = RawClient(b.port, MQTT_5)
        p.connect("rp")
        codes = []
        for i in range(3):
            p.publish("r/t", b"%d" % i, 1, packet_id=i + 1)
            codes.append(p.expect(Puback).reason_code)
        assert codes == [0, 0, ReasonCode.QUOTA_EXCEEDED]


def test_max_connections_refuses_extra_clients(tmp_path: Path):
    with broker_with(tmp_path, "[limits]\nmax_connections = 1\n") as b:
        first = RawClient(b.port, MQTT_5)
        assert first.connect("one").reason_code == 0
        second = RawClient(b.port, MQTT_5)
        assert second.connect("two").reason_code == ReasonCode.QUOTA_EXCEEDED
        v3 = RawClient(b.port)
        assert v3.connect("three").reason_code != 0  # 3.1.1: server unavailable
