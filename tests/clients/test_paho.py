"""paho-mqtt (MQTT 3.1.1 and 5.0) against a running broker: pub/sub, retained, will, persistent sessions."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.support.broker import BrokerProcess
from tests.support.paho_client import VERSIONS, WAIT, Msg, Paho
from tests.support.procs import LineReader, kill_hard


@pytest.fixture(params=sorted(VERSIONS))
def version(request: pytest.FixtureRequest) -> str:
    """The MQTT protocol version under test."""
    return str(request.param)


def topic(name: str) -> str:
    """A topic unique to one test."""
    return f"paho/{uuid.uuid4().hex[:8]}/{name}"


def test_qos0_and_qos1_publish_reach_subscriber_exactly(broker: BrokerProcess, version: str) -> None:
    base = topic("pubsub")
    sub, pub = Paho(broker, version), Paho(broker, version)
    sub.connect()
    sub.subscribe(base + "/#", 1)
    pub.connect()
    sent = {0: [f"q0-{i}".encode() for i in range(5)], 1: [f"q1-{i}".encode() * 20 for i in range(5)]}
    for qos, payloads in sent.items():
        for p in payloads:
            pub.publish(f"{base}/q{qos}", p, qos=qos)
    got = sub.receive(10)
    pub.close()
    sub.close()
    for qos, payloads in sent.items():
        assert [m.payload for m in got if m.topic == f"{base}/q{qos}"] == payloads  # ordered per topic and QoS
        assert {m.qos for m in got if m.topic == f"{base}/q{qos}"} == {qos}
    assert sub.messages.empty()


def test_retained_message_goes_to_late_subscriber_and_can_be_cleared(broker: BrokerProcess, version: str) -> None:
    t = topic("retained")
    pub = Paho(broker, version)
    pub.connect()
    pub.publish(t, b"kept-state", qos=1, retain=True)
    late = Paho(broker, version)
    late.connect()
    late.subscribe(t, 1)
    assert late.receive(1) == [Msg(t, b"kept-state", 1, True)]
    pub.publish(t, b"", qos=1, retain=True)  # [MQTT-3.3.1-10] empty retained payload clears it
    assert late.receive(1) == [Msg(t, b"", 1, False)]
    later = Paho(broker, version)
    later.connect()
    later.subscribe(t, 1)
    pub.publish(t, b"live", qos=1)
    assert later.receive(1) == [Msg(t, b"live", 1, False)]  # nothing retained came first
    for c in (pub, late, later):
        c.close()


WILL_CLIENT = """
import sys, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
host, port, version, will_topic, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="will-" + payload,
                protocol=mqtt.MQTTv5 if version == "v5" else mqtt.MQTTv311)
c.will_set(will_topic, payload.encode(), qos=1)
c.on_connect = lambda *a: print("connected", flush=True)
c.connect(host, port, keepalive=60)
c.loop_start()
time.sleep(60)
"""


def start_will_client(broker: BrokerProcess, version: str, will_topic: str, payload: str) -> subprocess.Popen[str]:
    """A paho client in a child process that sets a will and prints 'connected'."""
    return subprocess.Popen([sys.executable, "-c", WILL_CLIENT, broker.host, str(broker.port), version, will_topic,
                             payload], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_will_published_on_abrupt_loss_not_on_clean_disconnect(broker: BrokerProcess, version: str) -> None:
    will_topic = topic("will")
    watcher = Paho(broker, version)
    watcher.connect()
    watcher.subscribe(will_topic, 1)
    polite = Paho(broker, version, client_id="polite-" + version)
    polite.client.will_set(will_topic, b"polite-will", qos=1)
    polite.connect()
    polite.close()  # [MQTT-3.14.4-3] a DISCONNECT discards the will
    child = start_will_client(broker, version, will_topic, "abrupt-will")
    try:
        LineReader(child).wait_for("connected", WAIT)
    finally:
        kill_hard(child)  # the socket closes with no DISCONNECT: [MQTT-3.1.2-8] the will is published
    assert watcher.receive(1) == [Msg(will_topic, b"abrupt-will", 1, False)]
    watcher.close()


def test_persistent_session_receives_what_was_queued_offline(broker: BrokerProcess, version: str) -> None:
    t = topic("offline")
    client_id = f"persist-{version}-{uuid.uuid4().hex[:6]}"
    sub = Paho(broker, version, client_id=client_id, clean=True)
    sub.connect()
    sub.close()
    sub = Paho(broker, version, client_id=client_id, clean=False)
    sub.connect()
    sub.subscribe(t, 1)
    sub.close()
    pub = Paho(broker, version)
    pub.connect()
    queued = [f"queued-{i}".encode() for i in range(5)]
    for p in queued:
        pub.publish(t, p, qos=1)
    pub.close()
    again = Paho(broker, version, client_id=client_id, clean=False)
    assert again.connect() is True  # [MQTT-3.2.2-2] session present
    assert [m.payload for m in again.receive(5)] == queued
    again.close()
    assert again.messages.empty()

