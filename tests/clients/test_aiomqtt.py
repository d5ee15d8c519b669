"""aiomqtt (asyncio, 3.1.1 and 5.0) against a running broker: pub/sub, retained, will, persistent sessions."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.broker import BrokerProcess
from tests.support.procs import LineReader, kill_hard

WAIT = 10.0
VERSIONS = {"v311": aiomqtt.ProtocolVersion.V311, "v5": aiomqtt.ProtocolVersion.V5}


@pytest.fixture(params=sorted(VERSIONS))
def version(request: pytest.FixtureRequest) -> str:
    """The MQTT protocol version under test."""
    return str(request.param)


def client(broker: BrokerProcess, version: str, identifier: str | None = None, clean: bool = True,
           **kwargs: Any) -> aiomqtt.Client:
    """An aiomqtt client; clean=False asks for a persistent session (5.0: clean_start off, 300 s expiry)."""
    if version == "v5":
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0 if clean else 300
        kwargs |= {"clean_start": clean, "properties": props}
    else:
        kwargs |= {"clean_session": clean}
    return aiomqtt.Client(broker.host, broker.port, identifier=identifier, protocol=VERSIONS[version],
                          timeout=WAIT, **kwargs)


async def receive(c: aiomqtt.Client, count: int) -> list[tuple[str, bytes, int, bool]]:
    """The next count messages as (topic, payload, qos, retain), within WAIT seconds in all."""
    got: list[tuple[str, bytes, int, bool]] = []
    async with asyncio.timeout(WAIT):
        async for m in c.messages:
            assert isinstance(m.payload, bytes)
            got.append((m.topic.value, m.payload, m.qos, bool(m.retain)))
            if len(got) == count:
                break
    return got


def topic(name: str) -> str:
    """A topic unique to one test."""
    return f"aio/{uuid.uuid4().hex[:8]}/{name}"


async def test_qos0_and_qos1_publish_reach_subscriber_exactly(broker: BrokerProcess, version: str) -> None:
    base = topic("pubsub")
    sent = {0: [f"a{i}".encode() for i in range(5)], 1: [bytes([i]) * 100 for i in range(5)]}
    async with client(broker, version) as sub, client(broker, version) as pub:
        await sub.subscribe(base + "/#", qos=1)
        for qos, payloads in sent.items():
            for p in payloads:
                await pub.publish(f"{base}/q{qos}", p, qos=qos)
        got = await receive(sub, 10)
    for qos, payloads in sent.items():
        assert [(p, q) for t, p, q, _r in got if t == f"{base}/q{qos}"] == [(p, qos) for p in payloads]


async def test_retained_message_goes_to_late_subscriber(broker: BrokerProcess, version: str) -> None:
    t = topic("retained")
    async with client(broker, version) as pub:
        await pub.publish(t, b"sensor-config-v2", qos=1, retain=True)
    async with client(broker, version) as late:
        await late.subscribe(t, qos=1)
        assert await receive(late, 1) == [(t, b"sensor-config-v2", 1, True)]


WILL_CLIENT = """
import asyncio, sys
import aiomqtt
host, port, version, will_topic, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
proto = aiomqtt.ProtocolVersion.V5 if version == "v5" else aiomqtt.ProtocolVersion.V311
async def main():
    will = aiomqtt.Will(will_topic, payload.encode(), qos=1)
    async with aiomqtt.Client(host, port, protocol=proto, will=will, keepalive=60):
        print("connected", flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_will_published_when_client_dies(broker: BrokerProcess, version: str) -> None:
    will_topic = topic("will")
    async with client(broker, version) as watcher:
        await watcher.subscribe(will_topic, qos=1)
        child = subprocess.Popen([sys.executable, "-c", WILL_CLIENT, broker.host, str(broker.port), version,
                                  will_topic, "last-words"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            await asyncio.to_thread(LineReader(child).wait_for, "connected", WAIT)
        finally:
            kill_hard(child)  # no DISCONNECT reaches the broker: [MQTT-3.1.2-8]
        assert await receive(watcher, 1) == [(will_topic, b"last-words", 1, False)]


async def test_persistent_session_receives_what_was_queued_offline(broker: BrokerProcess, version: str) -> None:
    t = topic("offline")
    ident = f"aio-persist-{uuid.uuid4().hex[:6]}"
    async with client(broker, version, identifier=ident, clean=True):
        pass  # start from an empty session
    async with client(broker, version, identifier=ident, clean=False) as sub:
        await sub.subscribe(t, qos=1)
    queued = [f"while-away-{i}".encode() for i in range(6)]
    async with client(broker, version) as pub:
        for p in queued:
            await pub.publish(t, p, qos=1)
    async with client(broker, version, identifier=ident, clean=False) as back:
        assert [p for _t, p, _q, _r in await receive(back, len(queued))] == queued
