"""MQTT data representations [MQTT-1.5]: integers, variable byte integers, UTF-8 strings, binary data."""

from __future__ import annotations

from .errors import MalformedPacket

MAX_VARINT = 268_435_455  # four bytes of seven bits [MQTT-1.5.5]
MAX_UINT16 = 0xFFFF
MAX_UINT32 = 0xFFFF_FFFF

# One-byte encodings are by far the most common; precompute them.
_SMALL_VARINTS = [bytes((n,)) for n in range(128)]
U16 = [n.to_bytes(2, "big") for n in range(256)]


def encode_varint(value: int) -> bytes:
    """Encode a Variable Byte Integer [MQTT-1.5.5]; 0..268,435,455."""
    if value < 128:
        if value < 0:
            raise MalformedPacket(f"variable byte integer {value} is negative")
        return _SMALL_VARINTS[value]
    if value > MAX_VARINT:
        raise MalformedPacket(f"variable byte integer {value} exceeds {MAX_VARINT}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer at `pos`; returns (value, next position). At most four bytes [MQTT-1.5.5-1]."""
    value = 0
    shift = 0
    for i in range(4):
        if pos + i >= end:
            raise MalformedPacket("truncated variable byte integer")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise MalformedPacket("variable byte integer longer than four bytes [MQTT-1.5.5-1]")


def encode_u16(value: int) -> bytes:
    """Encode a Two Byte Integer [MQTT-1.5.2]."""
    if not 0 <= value <= MAX_UINT16:
        raise MalformedPacket(f"two byte integer {value} out of range")
    return value.to_bytes(2, "big")


def encode_u32(value: int) -> bytes:
    """Encode a Four Byte Integer [MQTT-1.5.3]."""
    if not 0 <= value <= MAX_UINT32:
        raise MalformedPacket(f"four byte integer {value} out of range")
    return value.to_bytes(4, "big")


def encode_utf8(text: str) -> bytes:
    """Encode a length-prefixed UTF-8 string, refusing U+0000 and surrogates [MQTT-1.5.4-1,2]."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MalformedPacket("string contains a surrogate code point [MQTT-1.5.4-1]") from exc
    if len(data) > MAX_UINT16:
        raise MalformedPacket("string longer than 65,535 bytes [MQTT-1.5.4]")
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000 [MQTT-1.5.4-2]")
    return U16[len(data)] + data if len(data) < 256 else len(data).to_bytes(2, "big") + data


def encode_binary(data: bytes) -> bytes:
    """Encode length-prefixed Binary Data [MQTT-1.5.6]."""
    if len(data) > MAX_UINT16:
        raise MalformedPacket("binary data longer than 65,535 bytes [MQTT-1.5.6]")
    return len(data).to_bytes(2, "big") + bytes(data)


def check_utf8(raw: bytes) -> str:
    """Decode well-formed UTF-8 without U+0000; a U+FEFF BOM is kept, never stripped [MQTT-1.5.4-1..3]."""
    try:
        text = raw.decode("utf-8")  # strict: rejects surrogates and overlong forms [MQTT-1.5.4-1]
    except UnicodeDecodeError as exc:
        raise MalformedPacket("ill-formed UTF-8 string [MQTT-1.5.4-1]") from exc
    if "\x00" in text:
        raise MalformedPacket("string contains U+0000 [MQTT-1.5.4-2]")
    return text


class Reader:
    """Bounds-checked cursor over one packet's bytes; every overrun is a MalformedPacket."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def remaining(self) -> int:
        """Bytes left before the end of the packet."""
        return self.end - self.pos

    def _take(self, n: int) -> int:
        start = self.pos
        if start + n > self.end:
            raise MalformedPacket("packet shorter than its contents require")
        self.pos = start + n
        return start

    def u8(self) -> int:
        """Read a Byte."""
        return self.buf[self._take(1)]

    def u16(self) -> int:
        """Read a Two Byte Integer."""
        start = self._take(2)
        return (self.buf[start] << 8) | self.buf[start + 1]

    def u32(self) -> int:
        """Read a Four Byte Integer."""
        start = self._take(4)
        return int.from_bytes(self.buf[start : start + 4], "big")

    def varint(self) -> int:
        """Read a Variable Byte Integer."""
        value, self.pos = decode_varint(self.buf, self.pos, self.end)
        return value

    def binary(self) -> bytes:
        """Read length-prefixed Binary Data."""
        size = self.u16()
        start = self._take(size)
        return bytes(self.buf[start : start + size])

    def utf8(self) -> str:
        """Read a length-prefixed UTF-8 string."""
        size = self.u16()
        start = self._take(size)
        return check_utf8(self.buf[start : start + size])

    def rest(self) -> bytes:
        """Read everything up to the end of the packet."""
        start = self.pos
        self.pos = self.end
        return bytes(self.buf[start : self.end])

    def expect_end(self, what: str) -> None:
        """Fail if bytes remain after the last field."""
        if self.pos != self.end:
            raise MalformedPacket(f"{self.end - self.pos} trailing bytes after {what}")
