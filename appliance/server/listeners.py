"""Listeners: plain TCP, TLS (optional client certificates) and WebSocket (subprotocol "mqtt") over either."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from .config import Config, ConfigError, parse_hostport

log = logging.getLogger("appliance.listeners")


def tls_context(config: Config) -> ssl.SSLContext:
    """Server TLS context from [listener] certfile/keyfile/cafile; client certificates when configured."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(config.get("listener", "certfile"), config.get("listener", "keyfile"))
        cafile = config.get("listener", "cafile")
        if cafile:
            ctx.load_verify_locations(cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"listener.certfile/keyfile/cafile: {exc}") from None
    if config.get("listener", "require_client_cert"):
        if not config.get("listener", "cafile"):
            raise ConfigError("listener.require_client_cert: needs listener.cafile")
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif config.get("listener", "cafile"):
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class _WsTransport(asyncio.Transport):
    """The transport an inner MQTT protocol writes to: each write becomes one binary WebSocket message."""

    def __init__(self, outer: WebSocketProtocol) -> None:
        super().__init__()
        self._outer = outer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send `data` as a binary message."""
        self._outer.send_ws(BytesMessage(data=bytes(data)))

    def close(self) -> None:
        """Close the WebSocket cleanly, then the TCP connection."""
        self._outer.close_ws()

    def is_closing(self) -> bool:
        """True once close was requested or the connection is gone."""
        return self._outer.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """Delegate to the real transport (peername, peercert, ...)."""
        assert self._outer.transport is not None
        return self._outer.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Apply the limits to the underlying TCP transport (back-pressure reaches the MQTT protocol)."""
        if self._outer.transport is not None:
            self._outer.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        """Bytes buffered in the underlying TCP transport."""
        return self._outer.transport.get_write_buffer_size() if self._outer.transport is not None else 0

    def pause_reading(self) -> None:
        """Pause the underlying TCP transport."""
        if self._outer.transport is not None:
            self._outer.transport.pause_reading()

    def resume_reading(self) -> None:
        """Resume the underlying TCP transport."""
        if self._outer.transport is not None:
            self._outer.transport.resume_reading()


class WebSocketProtocol(asyncio.Protocol):
    """Server side of RFC 6455 with sans-I/O wsproto; binary messages carry the MQTT byte stream [MQTT-6.0.0]."""

    def __init__(self, inner_factory: Callable[[], asyncio.Protocol]) -> None:
        self.ws = WSConnection(ConnectionType.SERVER)
        self.inner_factory = inner_factory
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Remember the TCP transport; the handshake comes with the first bytes."""
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        """Drive the WebSocket state machine and hand message bytes to the MQTT protocol."""
        try:
            self.ws.receive_data(data)
            for event in self.ws.events():
                self._on_event(event)
        except (RemoteProtocolError, LocalProtocolError) as exc:  # WebSocket protocol violation: end it
            log.info("websocket %s: %s", self._peer(), exc)
            self.closing = True
            if self.transport is not None:
                self.transport.close()

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    def _on_event(self, event: object) -> None:
        if isinstance(event, Request):
            if "mqtt" not in event.subprotocols:  # [MQTT-6.0.0-3]
                self._send(self.ws.send(RejectConnection(status_code=400)))
                self.closing = True
                assert self.transport is not None
                self.transport.close()
                return
            self._send(self.ws.send(AcceptConnection(subprotocol="mqtt")))
            self.inner = self.inner_factory()
            self.inner.connection_made(_WsTransport(self))
        elif isinstance(event, BytesMessage) and self.inner is not None:
            self.inner.data_received(bytes(event.data))
        elif isinstance(event, TextMessage):  # MQTT must use binary frames [MQTT-6.0.0-1]
            self.close_ws()
        elif isinstance(event, Ping):
            self._send(self.ws.send(event.response()))
        elif isinstance(event, CloseConnection):
            if self.ws.state.name == "REMOTE_CLOSING":
                self._send(self.ws.send(event.response()))
            self.closing = True
            if self.transport is not None:
                self.transport.close()

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send_ws(self, message: BytesMessage) -> None:
        """Frame and write one binary message."""
        if not self.closing:
            self._send(self.ws.send(message))

    def close_ws(self) -> None:
        """Send a close frame and close the TCP connection."""
        if self.closing:
            return
        self.closing = True
        try:
            self._send(self.ws.send(CloseConnection(code=1000)))
        except Exception:
            pass  # the handshake never completed: nothing to close politely
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """Tell the MQTT protocol its stream ended."""
        self.closing = True
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Propagate transport back-pressure."""
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        """Propagate transport back-pressure."""
        if self.inner is not None:
            self.inner.resume_writing()


async def async_start_listeners(
    config: Config, loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol]
) -> list[asyncio.AbstractServer]:
    """Open every configured listener; raises OSError (port in use) or ConfigError (bad TLS files)."""
    servers: list[asyncio.AbstractServer] = []
    tcp = config.get("listener", "tcp")
    if tcp:
        host, port = parse_hostport(tcp, "listener.tcp")
        servers.append(await loop.create_server(factory, host, port, reuse_address=True, backlog=1024))
    tls = config.get("listener", "tls")
    ctx = tls_context(config) if tls or config.get("listener", "ws_tls") else None
    if tls:
        host, port = parse_hostport(tls, "listener.tls")
        servers.append(await loop.create_server(factory, host, port, ssl=ctx, reuse_address=True))
    ws = config.get("listener", "ws")
    if ws:
        host, port = parse_hostport(ws, "listener.ws")
        servers.append(
            await loop.create_server(
                lambda: WebSocketProtocol(factory), host, port,
                ssl=ctx if config.get("listener", "ws_tls") else None, reuse_address=True,
            )
        )
    return servers
