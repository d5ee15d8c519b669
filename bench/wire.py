"""A minimal MQTT 3.1.1 encoder/decoder for the load generator (independent of the broker's own codec)."""

from __future__ import annotations

import struct

CONNECT, CONNACK, PUBLISH, PUBACK, SUBSCRIBE, SUBACK, PINGREQ, DISCONNECT = 1, 2, 3, 4, 8, 9, 12, 14


def varint(n: int) -> bytes:
    """The MQTT variable byte integer encoding of n."""
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def utf8(s: str | bytes) -> bytes:
    """A two-byte-length-prefixed string."""
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def packet(first: int, body: bytes) -> bytes:
    """Fixed header (type/flags byte, remaining length) plus body."""
    return bytes([first]) + varint(len(body)) + body


def connect(client_id: str, clean: bool = True, keepalive: int = 60) -> bytes:
    """A 3.1.1 CONNECT without will or credentials."""
    flags = 0x02 if clean else 0x00
    return packet(0x10, utf8("MQTT") + bytes([4, flags]) + struct.pack("!H", keepalive) + utf8(client_id))


def publish(topic: str | bytes, payload: bytes, qos: int = 0, pid: int = 0, retain: bool = False) -> bytes:
    """A PUBLISH; pid is used only for QoS > 0."""
    body = utf8(topic) + (struct.pack("!H", pid) if qos else b"") + payload
    return packet(0x30 | qos << 1 | int(retain), body)


def publish_template(topic: str | bytes, payload_len: int) -> tuple[bytes, int]:
    """Header+topic+pid placeholder for a QoS1 PUBLISH of payload_len bytes, and the packet-id offset in it."""
    t = utf8(topic)
    head = bytes([0x32]) + varint(len(t) + 2 + payload_len) + t
    return head, len(head)


def puback(pid: int) -> bytes:
    """A PUBACK for pid."""
    return struct.pack("!BBH", 0x40, 2, pid)


def subscribe(pid: int, topic_filter: str, qos: int) -> bytes:
    """A SUBSCRIBE with one filter."""
    return packet(0x82, struct.pack("!H", pid) + utf8(topic_filter) + bytes([qos]))


def disconnect() -> bytes:
    """A DISCONNECT."""
    return b"\xe0\x00"


class Reader:
    """Split a byte stream into (first_byte, body) packets; tolerates packets split across reads."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        """Start with an empty buffer."""
        self.buf = b""

    def feed(self, data: bytes) -> list[tuple[int, memoryview]]:
        """Append data; return every complete packet as (first byte, body view)."""
        buf = self.buf + data if self.buf else data
        out: list[tuple[int, memoryview]] = []
        view = memoryview(buf)
        i, n = 0, len(buf)
        while i + 2 <= n:
            length, mult, j = 0, 1, i + 1
            while True:
                if j >= n:
                    self.buf = bytes(buf[i:])
                    return out
                b = buf[j]
                length += (b & 0x7F) * mult
                mult <<= 7
                j += 1
                if not b & 0x80:
                    break
            end = j + length
            if end > n:
                break
            out.append((buf[i], view[j:end]))
            i = end
        self.buf = bytes(buf[i:])
        return out


def publish_fields(first: int, body: memoryview) -> tuple[bytes, int, memoryview]:
    """(topic, packet id or 0, payload) of a PUBLISH body."""
    tlen = body[0] << 8 | body[1]
    topic = bytes(body[2 : 2 + tlen])
    pos = 2 + tlen
    pid = 0
    if first & 0x06:
        pid = body[pos] << 8 | body[pos + 1]
        pos += 2
    return topic, pid, body[pos:]
