"""A paho-mqtt client on a background loop thread with bounded waits, for tests against a real broker."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.broker import BrokerProcess

WAIT = 10.0
VERSIONS = {"v311": mqtt.MQTTv311, "v5": mqtt.MQTTv5}


@dataclass(frozen=True)
class Msg:
    """What a subscriber saw."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


class Paho:
    """A paho client on a background loop thread, with bounded waits for CONNACK, SUBACK and messages."""

    def __init__(self, broker: BrokerProcess, version: str, client_id: str = "", clean: bool = True) -> None:
        """Create (not yet connect) a client; clean is clean_session (3.1.1) or clean_start (5.0)."""
        self.broker, self.v5, self.clean = broker, version == "v5", clean
        kwargs: dict[str, Any] = {} if self.v5 else {"clean_session": clean}
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=VERSIONS[version],
                                  **kwargs)
        self.messages: queue.Queue[Msg] = queue.Queue()
        self.connacks: queue.Queue[tuple[bool, int]] = queue.Queue()
        self.subacks: queue.Queue[int] = queue.Queue()
        self.client.on_message = lambda _c, _u, m: self.messages.put(
            Msg(m.topic, bytes(m.payload), m.qos, bool(m.retain))
        )
        self.client.on_connect = lambda _c, _u, flags, rc, _p: self.connacks.put((flags.session_present, rc.value))
        self.client.on_subscribe = lambda _c, _u, mid, _rcs, _p: self.subacks.put(mid)

    def connect(self) -> bool:
        """Connect, start the loop, wait for a successful CONNACK; return session_present."""
        props = None
        if self.v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0 if self.clean else 300
        kwargs: dict[str, Any] = {"clean_start": self.clean, "properties": props} if self.v5 else {}
        self.client.connect(self.broker.host, self.broker.port, keepalive=30, **kwargs)
        self.client.loop_start()
        session_present, rc = self.connacks.get(timeout=WAIT)
        assert rc == 0, f"CONNACK reason {rc}"
        return session_present

    def subscribe(self, topic: str, qos: int) -> None:
        """Subscribe and wait for the SUBACK."""
        result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        assert self.subacks.get(timeout=WAIT) == mid

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish and wait until paho has handed it over (QoS1: PUBACK received)."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(timeout=WAIT)
        assert info.is_published()

    def receive(self, count: int) -> list[Msg]:
        """The next count messages, each within WAIT seconds."""
        return [self.messages.get(timeout=WAIT) for _ in range(count)]

    def close(self) -> None:
        """Send DISCONNECT and stop the loop."""
        self.client.disconnect()
        self.client.loop_stop()
