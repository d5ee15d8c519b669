"""Inter-node framing and the cluster message codec (sans-I/O): bytes in -> messages out, message -> bytes.

Frame := u32 big-endian length of (type + body) | u8 type | body. Bodies are sequences of fields in the order the
message dataclass declares them: varint integers (LEB128), length-prefixed UTF-8 strings and byte strings, IEEE-754
doubles, and nested structures (broker Messages, version vectors, DVV clocks) built from those.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from appliance.broker.model import Message
from appliance.protocol.errors import MQTTError
from appliance.protocol.packets import PacketType, Properties
from appliance.protocol.primitives import Reader
from appliance.protocol.properties import decode_properties, encode_properties

from . import dvv
from .dvv import DVVSet, VersionVector
from .errors import ClusterError, WireError

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">IB")
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
_F64 = struct.Struct(">d")
_NO_PROPERTIES = b"\x00"  # an empty MQTT 5 Properties field: length 0


# ---- field primitives -------------------------------------------------------------------------------------------
class _Writer:
    """Append-only body builder."""

    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out = bytearray()

    def uint(self, n: int) -> None:
        if 0 <= n < 0x80:
            self.out.append(n)
            return
        if n < 0:
            raise WireError(f"negative integer {n} in a cluster message")
        while n > 0x7F:
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7
        self.out.append(n)

    def raw(self, b: bytes) -> None:
        n = len(b)
        if n < 0x80:
            self.out.append(n)
        else:
            self.uint(n)
        self.out += b

    def text(self, s: str) -> None:
        self.raw(s.encode())

    def f64(self, x: float) -> None:
        self.out += _F64.pack(x)


class _Reader:
    """Bounds-checked cursor over one frame body; every overrun is a WireError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def uint(self) -> int:
        pos = self.pos
        if pos < len(self.buf) and self.buf[pos] < 0x80:  # one-byte varint: the common case
            self.pos = pos + 1
            return self.buf[pos]
        result = shift = 0
        while True:
            if self.pos >= len(self.buf):
                raise WireError("truncated integer")
            byte = self.buf[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise WireError("integer too long")

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise WireError("field runs past the end of the frame")
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def raw(self) -> bytes:
        return self.take(self.uint())

    def text(self) -> str:
        try:
            return self.raw().decode()
        except UnicodeDecodeError as exc:
            raise WireError("string field is not UTF-8") from exc

    def f64(self) -> float:
        return float(_F64.unpack(self.take(8))[0])


_ENCODED_MAX = 4096
_encoded: dict[str, tuple[Message, bytes]] = {}  # msg id -> (decoded message, its encoding): the newest received
_encoded_old: dict[str, tuple[Message, bytes]] = {}  # the generation before


def _remember_encoding(m: Message, data: bytes) -> None:
    """Keep a received message's encoding: a forwarded message is encoded again for its replica (OP_ENQUEUE)."""
    global _encoded, _encoded_old
    if len(_encoded) >= _ENCODED_MAX:
        _encoded_old, _encoded = _encoded, {}
    _encoded[m.msg_id] = (m, data)


def encode_message(w: _Writer, m: Message) -> None:
    """Write a broker Message (publication properties in their MQTT 5 encoding)."""
    msg_id = m.msg_id
    cached = _encoded.get(msg_id) or _encoded_old.get(msg_id)
    if cached is not None and cached[0] is m:
        w.out += cached[1]
        return
    _encode_message(w, m)


def _encode_message(w: _Writer, m: Message) -> None:
    w.text(m.msg_id)
    w.text(m.topic)
    w.raw(m.payload)
    w.uint(m.qos | (0x04 if m.retain else 0) | (0x08 if m.expiry_at is not None else 0))
    w.text(m.publisher)
    w.f64(m.created)
    if m.expiry_at is not None:
        w.f64(m.expiry_at)
    try:
        w.raw(encode_properties(m.properties, PacketType.PUBLISH))
    except MQTTError as exc:
        raise WireError(f"message properties cannot be encoded: {exc}") from exc


def decode_message(r: _Reader) -> Message:
    """Read a broker Message written by encode_message (its encoding is kept for a re-encode)."""
    start = r.pos
    m = _decode_message(r)
    _remember_encoding(m, r.buf[start : r.pos])
    return m


def _decode_message(r: _Reader) -> Message:
    msg_id, topic, payload, flags = r.text(), r.text(), r.raw(), r.uint()
    if flags & ~0x0F or flags & 0x03 == 3:
        raise WireError(f"bad message flags 0x{flags:02x}")
    publisher, created = r.text(), r.f64()
    expiry_at = r.f64() if flags & 0x08 else None
    raw_props = r.raw()
    if raw_props == _NO_PROPERTIES:
        return Message(msg_id, topic, payload, flags & 0x03, bool(flags & 0x04), publisher, created, expiry_at,
                       Properties())
    try:
        props = decode_properties(Reader(raw_props, 0, len(raw_props)), PacketType.PUBLISH)
    except MQTTError as exc:
        raise WireError(f"bad message properties: {exc}") from exc
    return Message(msg_id, topic, payload, flags & 0x03, bool(flags & 0x04), publisher, created, expiry_at, props)


def _put(w: _Writer, kind: str, value: Any) -> None:
    """Write one field of the given kind."""
    if kind == "uint":
        w.uint(value)
    elif kind == "message":
        encode_message(w, value)
    elif kind == "bool":
        w.uint(1 if value else 0)
    elif kind == "str":
        w.text(value)
    elif kind == "bytes":
        w.raw(value)
    elif kind == "f64":
        w.f64(value)
    elif kind == "strs":
        w.uint(len(value))
        for s in value:
            w.text(s)
    elif kind == "vvs":
        w.uint(len(value))
        for key, vv in value:
            w.text(key)
            w.raw(dvv.encode_vv(vv))
    elif kind == "clocks":
        w.uint(len(value))
        for key, clock in value:
            w.text(key)
            w.raw(dvv.encode(clock))
    else:  # pragma: no cover - a programming error in a message declaration
        raise AssertionError(kind)


def _read_bool(r: _Reader) -> bool:
    v = r.uint()
    if v > 1:
        raise WireError("boolean field is neither 0 nor 1")
    return bool(v)


def _read_strs(r: _Reader) -> tuple[str, ...]:
    return tuple(r.text() for _ in range(r.uint()))


def _read_vvs(r: _Reader) -> tuple[tuple[str, VersionVector], ...]:
    try:
        return tuple((r.text(), dvv.decode_vv(r.raw())) for _ in range(r.uint()))
    except ClusterError as exc:
        raise WireError(f"bad vvs field: {exc}") from exc


def _read_clocks(r: _Reader) -> tuple[tuple[str, DVVSet], ...]:
    try:
        return tuple((r.text(), dvv.decode(r.raw())) for _ in range(r.uint()))
    except ClusterError as exc:
        raise WireError(f"bad clocks field: {exc}") from exc


# How to read one field of each kind (the body layouts name kinds in ClusterMessage.FIELDS).
_FIELD_READERS: dict[str, Callable[[_Reader], Any]] = {
    "uint": _Reader.uint, "bool": _read_bool, "str": _Reader.text, "bytes": _Reader.raw, "f64": _Reader.f64,
    "strs": _read_strs, "message": decode_message, "vvs": _read_vvs, "clocks": _read_clocks,
}


# ---- messages ------------------------------------------------------------------------------------------------------
class ClusterMessage:
    """Base of every message on a peer link; TYPE is the frame type byte, FIELDS the body layout."""

    TYPE: ClassVar[int]
    FIELDS: ClassVar[tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Hello(ClusterMessage):
    """First frame each way: who I am, which cluster and protocol version, my fresh nonce."""

    TYPE = 0x01
    FIELDS = ("str", "str", "uint", "uint", "bytes")
    cluster: str
    node_id: str
    version: int
    incarnation: int  # changes on every node start: a newer incarnation's link replaces a stale one
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Auth(ClusterMessage):
    """Proof of the cluster secret: HMAC-SHA256 over both nonces, both node ids and the connection's addresses."""

    TYPE = 0x02
    FIELDS = ("bytes",)
    mac: bytes


@dataclass(frozen=True, slots=True)
class Heartbeat(ClusterMessage):
    """Liveness probe; the peer answers with HeartbeatAck carrying the same stamp (for round-trip time)."""

    TYPE = 0x03
    FIELDS = ("uint",)
    stamp: int


@dataclass(frozen=True, slots=True)
class HeartbeatAck(ClusterMessage):
    """Answer to a Heartbeat."""

    TYPE = 0x04
    FIELDS = ("uint",)
    stamp: int


@dataclass(frozen=True, slots=True)
class Goodbye(ClusterMessage):
    """Orderly close (node shutting down): not a failure."""

    TYPE = 0x05
    FIELDS = ("str",)
    reason: str


@dataclass(frozen=True, slots=True)
class Forward(ClusterMessage):
    """A message in the per-peer ordered stream; `clients` empty = route to the receiver's matching subscribers."""

    TYPE = 0x10
    FIELDS = ("uint", "message", "strs")
    seq: int
    message: Message
    clients: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ForwardAck(ClusterMessage):
    """Cumulative: every Forward up to and including `seq` is durably enqueued on the receiver."""

    TYPE = 0x11
    FIELDS = ("uint",)
    seq: int


@dataclass(frozen=True, slots=True)
class Digest(ClusterMessage):
    """Anti-entropy: the sender's version vector per key of `space`, and keys it garbage-collected lately."""

    TYPE = 0x20
    FIELDS = ("str", "vvs", "bool", "vvs")
    space: str
    entries: tuple[tuple[str, VersionVector], ...]
    final: bool = True  # the last chunk of this digest round
    collected: tuple[tuple[str, VersionVector], ...] = ()  # tombstones dropped, with the vector they had


@dataclass(frozen=True, slots=True)
class RepairRequest(ClusterMessage):
    """Anti-entropy: send me your clocks for these keys (mine are older or concurrent)."""

    TYPE = 0x21
    FIELDS = ("str", "strs")
    space: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Repair(ClusterMessage):
    """Anti-entropy / live replication: full clocks to sync into the receiver's state."""

    TYPE = 0x22
    FIELDS = ("str", "clocks")
    space: str
    clocks: tuple[tuple[str, DVVSet], ...]


@dataclass(frozen=True, slots=True)
class SessionTakeover(ClusterMessage):
    """`node` has a CONNECT for `client_id`: disconnect it there (0x8E) and hand over the session."""

    TYPE = 0x30
    FIELDS = ("uint", "str", "str", "bool")
    request_id: int
    client_id: str
    node: str
    clean_start: bool


@dataclass(frozen=True, slots=True)
class SessionState(ClusterMessage):
    """A chunk of the migrating session (record, queue, inflight) in the store's encoding; `final` ends it."""

    TYPE = 0x31
    FIELDS = ("uint", "str", "bool", "bytes", "bool")
    request_id: int
    client_id: str
    present: bool
    data: bytes
    final: bool = True


@dataclass(frozen=True, slots=True)
class SessionDone(ClusterMessage):
    """The taker committed the session (reason 0) or gave up (a reason code): the old owner may drop its copy."""

    TYPE = 0x32
    FIELDS = ("uint", "str", "uint")
    request_id: int
    client_id: str
    reason: int = 0


@dataclass(frozen=True, slots=True)
class Replicate(ClusterMessage):
    """Owner -> replica: one operation on a replicated session queue (op and data defined by the queue layer)."""

    TYPE = 0x40
    FIELDS = ("uint", "str", "uint", "bytes")
    seq: int
    client_id: str
    op: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ReplAck(ClusterMessage):
    """Replica -> owner: operation `seq` committed (status 0) or refused (a reason code)."""

    TYPE = 0x41
    FIELDS = ("uint", "uint")
    seq: int
    status: int = 0


MESSAGE_TYPES: dict[int, type[ClusterMessage]] = {
    cls.TYPE: cls
    for cls in (Hello, Auth, Heartbeat, HeartbeatAck, Goodbye, Forward, ForwardAck, Digest, RepairRequest, Repair,
                SessionTakeover, SessionState, SessionDone, Replicate, ReplAck)
}


_READERS: dict[type[ClusterMessage], tuple[Callable[[_Reader], Any], ...]] = {
    cls: tuple(_FIELD_READERS[kind] for kind in cls.FIELDS) for cls in MESSAGE_TYPES.values()
}
_LAYOUTS: dict[type[ClusterMessage], tuple[tuple[str, str], ...]] = {
    cls: tuple(zip((f.name for f in fields(cls)), cls.FIELDS, strict=True))  # type: ignore[arg-type]
    for cls in MESSAGE_TYPES.values()
}


def encode(msg: ClusterMessage) -> bytes:
    """One complete frame for `msg`."""
    w = _Writer()
    for name, kind in _LAYOUTS[type(msg)]:
        _put(w, kind, getattr(msg, name))
    out = w.out
    return HEADER.pack(len(out) + 1, msg.TYPE) + out


def decode_body(ftype: int, body: bytes) -> ClusterMessage:
    """Decode one frame's body given its type byte."""
    cls = MESSAGE_TYPES.get(ftype)
    if cls is None:
        raise WireError(f"unknown cluster frame type 0x{ftype:02x}")
    r = _Reader(body)
    values = [read(r) for read in _READERS[cls]]
    if r.pos != len(body):
        raise WireError(f"{cls.__name__}: {len(body) - r.pos} trailing bytes")
    return cls(*values)


class FrameDecoder:
    """Incremental frame parser: feed bytes as they arrive, pop whole messages one at a time."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame  # may be raised later (e.g. once a peer is authenticated)
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        """Add received bytes."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def pop(self) -> ClusterMessage | None:
        """The next complete message, or None until more bytes arrive. Raises WireError on a bad or oversized frame."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < HEADER.size:
            return None
        length, ftype = HEADER.unpack_from(buf, pos)
        if length < 1 or length > self.max_frame:
            raise WireError(f"frame length {length} outside 1..{self.max_frame}")
        end = pos + 4 + length
        if end > len(buf):
            return None
        self._pos = end
        return decode_body(ftype, bytes(buf[pos + HEADER.size : end]))

    def feed_all(self, data: bytes) -> list[ClusterMessage]:
        """Add bytes and return every message now complete."""
        self.feed(data)
        out: list[ClusterMessage] = []
        while (msg := self.pop()) is not None:
            out.append(msg)
        return out

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a frame."""
        return len(self._buf) - self._pos
