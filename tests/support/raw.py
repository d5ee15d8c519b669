"""A blocking raw-packet MQTT client for black-box tests: sends exactly the packets (or bytes) a test dictates."""

from __future__ import annotations

import socket
import time
from typing import Any, TypeVar

from appliance.protocol.codec import encode
from appliance.protocol.decoder import Decoder
from appliance.protocol.errors import MQTTError
from appliance.protocol.packets import (
    MQTT_5,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
)

T = TypeVar("T")


class Closed(Exception):
    """The broker closed the connection."""


class RawClient:
    """One TCP connection speaking MQTT through our codec; every wait is bounded."""

    def __init__(self, port: int, version: int = 4, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.version = version
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = Decoder(None, version)
        self.inbox: list[Packet] = []
        self.eof = False

    # -- sending -------------------------------------------------------------------------------------------------
    def send(self, *packets: Packet) -> None:
        """Encode and send packets in one write."""
        self.sock.sendall(b"".join(encode(p, self.version) for p in packets))

    def send_bytes(self, data: bytes) -> None:
        """Send raw bytes (malformed packets)."""
        self.sock.sendall(data)

    def connect(self, client_id: str, clean: bool = True, keepalive: int = 60, **kwargs: Any) -> Connack:
        """CONNECT and return the CONNACK."""
        self.send(Connect(client_id, self.version, clean, keepalive, **kwargs))
        return self.expect(Connack)

    def subscribe(self, topic_filter: str, qos: int = 1, packet_id: int = 1, **options: Any) -> Suback:
        """SUBSCRIBE to one filter and return the SUBACK."""
        props = options.pop("properties", Properties())
        self.send(Subscribe(packet_id, [SubscriptionRequest(topic_filter, qos, **options)], props))
        return self.expect(Suback)

    def publish(self, topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None, **kw: Any) -> None:
        """Send one PUBLISH (no waiting for its acknowledgement)."""
        self.send(Publish(topic, payload, qos, packet_id=packet_id, **kw))

    def ack(self, packet: Publish) -> None:
        """Acknowledge a received QoS1 (PUBACK) or QoS2 (PUBREC) PUBLISH."""
        if packet.qos == 1:
            self.send(Puback(packet.packet_id))  # type: ignore[arg-type]
        elif packet.qos == 2:
            self.send(Pubrec(packet.packet_id))  # type: ignore[arg-type]

    def disconnect(self, reason_code: int = 0) -> None:
        """Send DISCONNECT and close the socket."""
        try:
            self.send(Disconnect(reason_code))
        finally:
            self.close()

    def close(self) -> None:
        """Close the socket abruptly (no DISCONNECT)."""
        try:
            self.sock.close()
        except OSError:
            pass

    # -- receiving -----------------------------------------------------------------------------------------------
    def _fill(self, deadline: float) -> bool:
        """Read once; False when the deadline passed with nothing new."""
        if self.eof:
            raise Closed("connection closed by the broker")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise Closed("connection closed by the broker")
        try:
            self.inbox.extend(self.decoder.feed(data))
        except MQTTError as exc:
            raise AssertionError(f"broker sent bytes our decoder rejects: {exc}") from exc
        return True

    def recv(self, timeout: float | None = None) -> Packet | None:
        """The next packet, or None after `timeout` seconds."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.inbox:
            if not self._fill(deadline):
                return None
        return self.inbox.pop(0)

    def expect(self, kind: type[T], timeout: float | None = None) -> T:
        """The next packet, asserting its type."""
        packet = self.recv(timeout)
        assert packet is not None, f"expected {kind.__name__}, got nothing within the timeout"
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    def expect_closed(self, timeout: float | None = None) -> list[Packet]:
        """Read until the broker closes the connection; returns what arrived before (e.g. a DISCONNECT)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        got: list[Packet] = []
        while True:
            try:
                got.extend(self.inbox)
                self.inbox.clear()
                if not self._fill(deadline):
                    raise AssertionError(f"connection still open after the timeout; received {got!r}")
            except Closed:
                got.extend(self.inbox)
                self.inbox.clear()
                return got

    def collect(self, count: int, timeout: float | None = None, auto_ack: bool = True) -> list[Publish]:
        """Receive `count` PUBLISH packets (acknowledging each when auto_ack), failing on timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out: list[Publish] = []
        while len(out) < count:
            packet = self.recv(max(0.0, deadline - time.monotonic()))
            assert packet is not None, f"received {len(out)} of {count} messages: {[p.payload for p in out]}"
            if isinstance(packet, Publish):
                out.append(packet)
                if auto_ack:
                    self.ack(packet)
            elif isinstance(packet, Pubrel):
                self.send(Pubcomp(packet.packet_id))
        return out

    def quiet(self, timeout: float = 0.5) -> list[Packet]:
        """Whatever arrives within `timeout` (to assert that nothing does)."""
        deadline = time.monotonic() + timeout
        got: list[Packet] = []
        try:
            while self._fill(deadline):
                pass
        except Closed:
            pass
        got.extend(self.inbox)
        self.inbox.clear()
        return got


def v5(port: int, **kw: Any) -> RawClient:
    """A raw MQTT 5.0 client."""
    return RawClient(port, MQTT_5, **kw)
