"""State a real client relies on survives a graceful broker restart: retained messages and a persistent session."""

from __future__ import annotations

import uuid

from tests.support.broker import BrokerProcess
from tests.support.paho_client import Msg, Paho


def test_retained_and_queued_messages_survive_restart(broker: BrokerProcess) -> None:
    base = f"restart/{uuid.uuid4().hex[:8]}"
    ident = f"restart-sub-{uuid.uuid4().hex[:6]}"
    sub = Paho(broker, "v311", client_id=ident, clean=False)
    sub.connect()
    sub.subscribe(base + "/queue", 1)
    sub.close()
    pub = Paho(broker, "v311")
    pub.connect()
    pub.publish(base + "/state", b"retained-before-restart", qos=1, retain=True)
    queued = [f"acked-before-restart-{i}".encode() for i in range(5)]
    for p in queued:
        pub.publish(base + "/queue", p, qos=1)  # returns once PUBACKed
    pub.close()

    broker.restart()  # SIGTERM, then start again on the same port and data dir

    back = Paho(broker, "v311", client_id=ident, clean=False)
    assert back.connect() is True  # [MQTT-3.2.2-2] the session outlived the restart
    assert [m.payload for m in back.receive(len(queued))] == queued
    back.close()
    late = Paho(broker, "v311")
    late.connect()
    late.subscribe(base + "/state", 1)
    assert late.receive(1) == [Msg(base + "/state", b"retained-before-restart", 1, True)]
    late.close()
