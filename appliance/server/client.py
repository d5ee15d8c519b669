"""One client connection: bytes in -> protocol events -> broker rules; broker output -> coalesced writes."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from appliance.broker.broker import BrokerError
from appliance.broker.model import Message
from appliance.protocol.codec import encode_publish_properties
from appliance.protocol.connection import Connection, State
from appliance.protocol.errors import MQTTError
from appliance.protocol.packets import MQTT_5, Connack, Connect, Disconnect, Packet, Properties
from appliance.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from appliance.broker.session import Session

    from .node import Node

log = logging.getLogger("appliance.client")

_CLOSED = State.CLOSED  # a global: the enum attribute lookup is slow on the hot path
HIGH_WATER = 4 * 1024 * 1024  # bytes buffered for a slow reader before QoS0 messages to it are dropped


class ClientProtocol(asyncio.Protocol):
    """asyncio Protocol for one MQTT connection (TCP, TLS, or the inner side of a WebSocket)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        settings = node.broker.settings
        self.conn = Connection(
            max_packet_size=settings.max_packet_size,
            receive_maximum=settings.receive_maximum,
            topic_alias_maximum=settings.topic_alias_maximum,
        )
        self.transport: Any = None  # asyncio.Transport, or the WebSocket adapter
        self.session: Session | None = None
        self.protocol_version = 4
        self.keepalive = 0
        self.last_rx = 0.0
        self.closed = False
        self.peer = "?"
        self.cert_identity: str | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._held: list[Packet] | None = []  # packets produced before CONNACK; None once CONNACK is out
        self._pending_in: list[Packet] | None = None  # packets received while a password is being verified
        self._paused_writing = False
        self._loop = node.loop

    # -- asyncio callbacks ---------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register the connection and note the peer (and a verified certificate's CN)."""
        self.transport = transport
        set_limits = getattr(transport, "set_write_buffer_limits", None)
        if set_limits is not None:  # QoS0 to this client is dropped only past HIGH_WATER buffered bytes
            set_limits(high=HIGH_WATER, low=HIGH_WATER // 4)
        self.last_rx = self._loop.time()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        cert = transport.get_extra_info("peercert")
        if cert and self.node.config.get("listener", "use_identity_as_username"):
            for rdn in cert.get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        self.cert_identity = value
        self.node.connections.add(self)
        self.node.flow.admit(self)

    def data_received(self, data: bytes) -> None:
        """Decode and apply every complete packet."""
        self.last_rx = self._loop.time()
        self.node.broker.metrics.bytes_in += len(data)
        try:
            packets = self.conn.receive_data(data)
        except MQTTError as exc:
            self._protocol_error(exc)
            return
        self._apply(packets)

    def _apply(self, packets: list[Packet]) -> None:
        broker = self.node.broker
        for index, packet in enumerate(packets):
            if self.closed:
                return
            if self._pending_in is not None:
                self._pending_in.extend(packets[index:])
                return
            session = self.session
            if session is None:
                if type(packet) is Connect:
                    self._on_connect(packet)
                    continue
                self._fail(ReasonCode.PROTOCOL_ERROR)  # [MQTT-3.1.0-1]
                return
            try:
                broker.handle(session, self, packet)
            except BrokerError as exc:
                log.info("%s %s: %s", self.peer, session.client_id, exc)
                self._fail(exc.reason_code)
                return
            except Exception:  # a bug must cost one connection, never the node
                log.exception("%s %s: internal error handling %s", self.peer, session.client_id, type(packet).__name__)
                self._fail(ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)
                return

    def connection_lost(self, exc: Exception | None) -> None:
        """Detach from the session: will and expiry rules apply."""
        self.closed = True
        self.node.connections.discard(self)
        self.node.flow.drained(self)
        if self.session is not None and self.node.store.failure is None:  # after a store failure: only exit
            self.node.broker.connection_lost(self.session, self)

    def pause_reading(self) -> None:
        """Stop reading from this client (shutdown, or another client's congestion)."""
        if self.transport is not None and not self.closed and self._pending_in is None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again; the pause does not count against the client's keep alive."""
        if self.transport is not None and not self.closed and self._pending_in is None:
            self.last_rx = self._loop.time()
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        """The transport buffer is above its high-water mark: hold the publishers back (flow control)."""
        self._paused_writing = True
        self.node.flow.congested(self)

    def resume_writing(self) -> None:
        """The transport buffer drained."""
        self._paused_writing = False
        self.node.flow.drained(self)

    # -- CONNECT and authentication ------------------------------------------------------------------------------
    def _on_connect(self, packet: Connect) -> None:
        self.protocol_version = packet.protocol_version
        self.keepalive = self.node.broker.settings.negotiated_keepalive(packet.keepalive)
        auth = self.node.authenticator
        if auth.needs_slow_check(packet.username, packet.password, self.cert_identity):
            # scrypt takes tens of milliseconds: verify off the loop, hold what the client sends meanwhile
            self._pending_in = []
            self.transport.pause_reading()
            future = self._loop.run_in_executor(
                None, auth.check, packet.username, packet.password, self.cert_identity
            )
            future.add_done_callback(lambda f: self._connect_checked(packet, f))
            return
        self._finish_connect(packet, auth.check(packet.username, packet.password, self.cert_identity))

    def _connect_checked(self, packet: Connect, future: asyncio.Future[ReasonCode]) -> None:
        pending, self._pending_in = self._pending_in or [], None
        if self.closed:
            return
        self.transport.resume_reading()
        self._finish_connect(packet, future.result())
        self._apply(pending)

    def _finish_connect(self, packet: Connect, code: ReasonCode) -> None:
        cluster = self.node.cluster
        if cluster is not None and code == ReasonCode.SUCCESS:
            fetch = cluster.prepare_connect(packet.client_id, packet.clean_start)
            if fetch is not None:
                # The session lives on another node: take it over (or resume it from a replica) first; hold what
                # the client sends meanwhile, as during a slow password check.
                if self._pending_in is None:
                    self._pending_in = []
                self.transport.pause_reading()
                task: asyncio.Task[int] = self._loop.create_task(fetch)
                self.node.keep(task)
                task.add_done_callback(lambda t: self._connect_fetched(packet, t))
                return
        self.session = self.node.broker.connect(self, packet, code)

    def _connect_fetched(self, packet: Connect, task: asyncio.Task[int]) -> None:
        pending, self._pending_in = self._pending_in or [], None
        if self.closed:
            return
        self.transport.resume_reading()
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.error("%s: cluster takeover of %r failed", self.peer, packet.client_id, exc_info=task.exception())
            code = ReasonCode.SERVER_UNAVAILABLE
        else:
            code = ReasonCode(task.result())
        self.session = self.node.broker.connect(self, packet, code)
        self._apply(pending)

    # -- ClientLink (called by the broker) -----------------------------------------------------------------------
    def send(self, packet: Packet) -> None:
        """Queue a packet; nothing but CONNACK leaves before CONNACK [MQTT-3.2.0-1]."""
        if self.closed:
            return
        if self._held is not None:
            if type(packet) is not Connack:
                self._held.append(packet)
                return
            held, self._held = self._held, None
            self._write(self._encode(packet))
            for later in held:
                self._write(self._encode(later))
            return
        self._write(self.conn.send(packet))  # _encode, inlined

    def _encode(self, packet: Packet) -> bytes:
        return self.conn.send(packet)

    def publish(
        self, message: Message, qos: int, retain: bool, packet_id: int | None, dup: bool, subscription_ids: list[int]
    ) -> bool:
        """Encode and queue one PUBLISH; False when it exceeds the client's Maximum Packet Size."""
        conn = self.conn
        if self.closed or conn.state is _CLOSED:  # e.g. PUBACKs read with a DISCONNECT refill the window
            return True  # the session keeps it inflight; it is resent on the next connection
        if qos == 0 and self._paused_writing and self.node.flow.is_slow(self):
            self.node.broker.metrics.drop("slow_consumer")
            return True
        props = b""
        if self.protocol_version == MQTT_5:
            if message.expiry_at is not None:
                remaining = max(0, int(message.expiry_at - self.node.clock()))  # [MQTT-3.3.2-6]
                props = encode_publish_properties(_with_expiry(message.properties, remaining))
            else:
                cached = message.wire_properties
                if cached is None:
                    cached = message.wire_properties = encode_publish_properties(message.properties)
                props = cached
        data = conn.send_publish(message.topic, message.payload, qos, retain, dup, packet_id, props, subscription_ids)
        metrics = self.node.broker.metrics
        if not data:  # larger than the client's Maximum Packet Size [MQTT-3.1.2-25]
            metrics.drop("packet_too_large")
            return False
        self._out.append(data)  # _write, inlined
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        metrics.bytes_out += len(data)
        return True

    def close(self, reason_code: int | None = None) -> None:
        """Send DISCONNECT with `reason_code` to a v5 client that got its CONNACK, then close [MQTT-3.14]."""
        if self.closed:
            return
        if reason_code is not None and self._held is None and not self.conn.closed:
            data = self.conn.send(Disconnect(reason_code))  # b"" for 3.1.1: no server DISCONNECT there
            if data:
                self._write(data)
        self._flush()
        self.closed = True
        self.transport.close()

    # -- errors --------------------------------------------------------------------------------------------------
    def _protocol_error(self, exc: MQTTError) -> None:
        """A decoding or protocol-rule failure: answer per Connection.error_disconnect, then close."""
        log.info("%s: protocol error: %s", self.peer, exc)
        self.node.broker.metrics.drop("protocol_error")
        self._held = None
        data = self.conn.error_disconnect(exc)
        if data:
            self._write(data)
        self._flush()
        self.closed = True
        self.transport.close()

    def _fail(self, code: int) -> None:
        """A broker-rule failure after CONNECT: v5 clients get DISCONNECT with the reason, then close."""
        self.close(code)

    # -- output --------------------------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out or self.transport is None or self.transport.is_closing():
            out.clear()
            return
        self._out = []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))


def _with_expiry(props: Properties, remaining: int) -> Properties:
    return replace(props, message_expiry_interval=remaining)
