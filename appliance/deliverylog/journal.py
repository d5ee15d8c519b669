"""The binary journal of an open Parquet-format segment: framed, checksummed marshal batches, read up to any damage.

File: MAGIC, then frames `<u32 body length><u32 crc32 of body><body>`. The first body is the JSON header (the
writer's identity and the segment's first event counter); every later body is `<i64 first counter><u8 flags>
<u32 raw length>` followed by a flat batch [kind, wall ns, mono ns, fields, ...] (with flag LANES: a tuple (clock
offset, stepped, lanes batch), batch.lanes_flat; flag VARLEN, written by earlier versions: (clock offset, stepped,
queued batch), batch.fixed_flat) marshalled and, when flag LZ4 is set, LZ4-compressed. A frame is
good when it is whole, its checksum matches and its counter follows the previous frame's events; reading stops at the
first frame that is not.
"""

from __future__ import annotations

import functools
import json
import marshal
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from .batch import fixed_flat, lanes_flat

MAGIC = b"DLJ1\n"
_FRAME = struct.Struct("<II")
_BATCH = struct.Struct("<qBI")
SYNCED = 1  # flag: the clock was synchronised across the span the batch was emitted in
LZ4 = 2  # flag: the marshal bytes are LZ4-compressed
VARLEN = 4  # flag: the batch is (clock offset, stepped, queued batch) (batch.fixed_flat; earlier versions' drain)
LANES = 8  # flag: the batch is (clock offset, stepped, lanes batch) as DeliveryLog drains it (batch.lanes_flat)
MAX_BODY = 1 << 30


@functools.cache
def _lz4() -> Any:
    """pyarrow's LZ4 codec, or None when unavailable (frames are then stored raw)."""
    try:
        import pyarrow as pa
    except ImportError:
        return None
    return pa.Codec("lz4") if pa.Codec.is_available("lz4") else None


def frame(body: bytes) -> bytes:
    """One frame around `body`."""
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def header(identity: dict[str, Any], first_counter: int) -> bytes:
    """The bytes a new journal starts with."""
    return MAGIC + frame(json.dumps({"identity": identity, "first_counter": first_counter}).encode())


def batch_frame(first_counter: int, synced: bool, packed: bytes, layout: int = 0) -> bytes:
    """One frame holding a marshalled flat batch (or the `layout` flag's form) whose first event is `first_counter`."""
    flags = (SYNCED if synced else 0) | layout
    data = packed
    codec = _lz4()
    if codec is not None:
        data = codec.compress(packed, asbytes=True)
        flags |= LZ4
    return frame(_BATCH.pack(first_counter, flags, len(packed)) + data)


@dataclass(slots=True)
class Batch:
    """One good frame: its events as a flat list, numbered from `first_counter`."""

    first_counter: int
    synced: bool
    flat: list[Any]

    @property
    def events(self) -> int:
        """Events in the batch."""
        return len(self.flat) // 4


@dataclass(slots=True)
class Journal:
    """What a journal file holds up to its first damage."""

    identity: dict[str, Any] | None  # None: not even the header is readable
    first_counter: int
    batches: list[Batch]
    complete: bool  # every byte belongs to a good frame
    good_bytes: int  # bytes up to the end of the last good frame

    @property
    def events(self) -> int:
        """Events in the good frames."""
        return sum(b.events for b in self.batches)


def is_journal(data: bytes) -> bool:
    """Whether `data` (a file's first bytes) starts a binary journal."""
    return data.startswith(MAGIC)


def _body(data: bytes, offset: int) -> bytes | None:
    """The body of the frame at `offset` if it is whole and its checksum matches."""
    if offset + _FRAME.size > len(data):
        return None
    length, crc = _FRAME.unpack_from(data, offset)
    start = offset + _FRAME.size
    if length > MAX_BODY or start + length > len(data):
        return None
    body = data[start : start + length]
    return body if zlib.crc32(body) == crc else None


def _decode_batch(body: bytes) -> tuple[int, bool, list[Any]] | None:
    """(first counter, synced, flat batch) of a batch body, or None when it does not decode to a flat batch."""
    if len(body) < _BATCH.size:
        return None
    first, flags, raw_len = _BATCH.unpack_from(body)
    data = body[_BATCH.size :]
    try:
        if flags & LZ4:
            codec = _lz4()
            if codec is None:
                return None
            data = codec.decompress(data, decompressed_size=raw_len, asbytes=True)
        flat = marshal.loads(data)
        if flags & LANES:
            offset, _, lanes = flat
            flat = lanes_flat(lanes, offset)
        elif flags & VARLEN:
            offset, _, queued = flat
            flat = fixed_flat(queued, offset)
    except (ValueError, EOFError, TypeError, OSError):  # pyarrow's errors on a bad LZ4 block are OSError
        return None
    if type(flat) is not list or len(flat) % 4:
        return None
    return first, bool(flags & SYNCED), flat


def read_journal(data: bytes) -> Journal:
    """The good frames of a journal's bytes, stopping at the first truncated, corrupt or out-of-sequence frame."""
    if not is_journal(data):
        return Journal(None, 0, [], not data, 0)
    offset = len(MAGIC)
    body = _body(data, offset)
    try:
        head = json.loads(body) if body is not None else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("identity"), dict):
        return Journal(None, 0, [], False, 0)
    assert body is not None
    offset += _FRAME.size + len(body)
    expected = first_counter = int(head.get("first_counter", 0))
    batches: list[Batch] = []
    while offset < len(data):
        body = _body(data, offset)
        decoded = _decode_batch(body) if body is not None else None
        if body is None or decoded is None or decoded[0] != expected:
            return Journal(head["identity"], first_counter, batches, False, offset)
        batch = Batch(*decoded)
        batches.append(batch)
        expected += batch.events
        offset += _FRAME.size + len(body)
    return Journal(head["identity"], first_counter, batches, True, offset)
