"""A minimal asyncio MQTT 5 connection on our sans-I/O codec: send packets, read packets, every wait bounded."""

from __future__ import annotations

import asyncio
import contextlib

from appliance.protocol.codec import encode
from appliance.protocol.decoder import Decoder
from appliance.protocol.errors import MQTTError
from appliance.protocol.packets import MQTT_5, Connack, Connect, Disconnect, Packet, Properties

VERSION = MQTT_5


class Gone(Exception):
    """The connection is closed, broken, or the broker stayed silent past a deadline."""


class Conn:
    """One TCP connection to a broker; packets arrive on `self.inbox` (None marks the end of the stream)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: int) -> None:
        self.reader = reader
        self.writer = writer
        self.node = node
        self.decoder = Decoder(None, VERSION)
        self.inbox: asyncio.Queue[Packet | None] = asyncio.Queue()
        self.closed = False
        self.last_rx = asyncio.get_running_loop().time()
        self._pump_task: asyncio.Task[None] | None = None

    @classmethod
    async def async_open(cls, host: str, port: int, node: int, timeout: float) -> Conn:
        """TCP connect within `timeout` seconds (asyncio sets TCP_NODELAY on its TCP transports)."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, TimeoutError) as exc:
            raise Gone(f"connect to {host}:{port}: {exc!r}") from exc
        conn = cls(reader, writer, node)
        conn._pump_task = asyncio.get_running_loop().create_task(conn._async_pump())
        return conn

    async def _async_pump(self) -> None:
        """Read bytes, decode packets, queue them; queue None at the end."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.last_rx = loop.time()
                for packet in self.decoder.feed(data):
                    self.inbox.put_nowait(packet)
        except (OSError, MQTTError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed = True
            self.inbox.put_nowait(None)

    def send(self, *packets: Packet) -> None:
        """Encode and write packets (no waiting; a dead socket shows up as end of stream)."""
        if self.closed:
            raise Gone("connection closed")
        try:
            self.writer.write(b"".join(encode(p, VERSION) for p in packets))
        except (OSError, RuntimeError) as exc:
            self.abort()
            raise Gone(f"write failed: {exc!r}") from exc

    async def async_drain(self, timeout: float) -> None:
        """Wait until the kernel took our bytes (a stopped broker stops taking them)."""
        try:
            await asyncio.wait_for(self.writer.drain(), timeout)
        except (OSError, TimeoutError, RuntimeError) as exc:
            self.abort()
            raise Gone(f"drain: {exc!r}") from exc

    async def async_recv(self, timeout: float) -> Packet:
        """The next packet within `timeout` seconds, else Gone."""
        try:
            packet = await asyncio.wait_for(self.inbox.get(), timeout)
        except TimeoutError as exc:
            raise Gone(f"nothing received in {timeout:.1f}s") from exc
        if packet is None:
            self.inbox.put_nowait(None)
            raise Gone("connection closed by the broker")
        return packet

    async def async_connect(self, client_id: str, clean_start: bool, session_expiry: int, timeout: float,
                            keepalive: int = 10) -> Connack:
        """CONNECT and wait for the CONNACK; Gone on refusal or silence."""
        self.send(Connect(client_id, VERSION, clean_start, keepalive,
                          properties=Properties(session_expiry_interval=session_expiry, receive_maximum=64)))
        packet = await self.async_recv(timeout)
        if not isinstance(packet, Connack):
            self.abort()
            raise Gone(f"expected CONNACK, got {type(packet).__name__}")
        if packet.reason_code >= 0x80:
            self.abort()
            raise Gone(f"CONNACK refused: 0x{packet.reason_code:02x}")
        return packet

    def disconnect(self) -> None:
        """Send a normal DISCONNECT (session kept: expiry is per session) and close."""
        with contextlib.suppress(Gone):
            self.send(Disconnect(0))
        self.abort()

    def abort(self) -> None:
        """Close the socket without DISCONNECT."""
        self.closed = True
        with contextlib.suppress(Exception):
            self.writer.close()
        if self._pump_task is not None and not self._pump_task.done():
            self._pump_task.cancel()
        self.inbox.put_nowait(None)
