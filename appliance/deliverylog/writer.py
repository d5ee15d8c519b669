"""Turns batches of emitted events into rotated, crash-safe segments (Parquet or gzip JSON Lines) under a disk budget.

The open segment is a gzip JSON Lines journal, sync-flushed and fsynced; in Parquet format the same events are also
buffered into row groups of a `.parquet.tmp`, which is fsynced and renamed when the segment closes, then the journal
is deleted. A crash leaves the journal, from which the segment is rebuilt at the next start.
"""

from __future__ import annotations

import errno
import fcntl
import json
import json.encoder
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .columnar import ROW_GROUP_EVENTS, ParquetSegment
from .identity import Identity
from .positional import fields_of, publisher_seq
from .schema import EMIT_FIELDS, KINDS, SCHEMA_VERSION
from .segments import (
    FORMATS,
    PARQUET,
    SegmentName,
    atomic_write,
    closed_segments,
    eviction_reasons,
    fsync_dir,
    parse_name,
    recover_part,
    safe_node,
    segment_events,
    write_all,
)

# kind, wall clock ns, CLOCK_MONOTONIC ns, fields (taken at emit time): a dict, or a positional.LAYOUTS tuple
Item = tuple[str, int, int, Any]
ITEM_LEN = 4  # entries per event in a flat batch [kind, wall, mono, fields, kind, ...]

COUNTER_BLOCK = 1 << 20  # event counters reserved per state write; a crash skips at most this many ids
# Kinds whose records carry all of a message's fields when the broker passes message=; others carry only msg_id.
FULL_MESSAGE_KINDS = frozenset({"received", "forwarded", "replicated", "migrated", "dropped", "expired"})
CLOSE_ROUNDS = 32  # segments close() may add for eviction records (each may evict an older one, whose are carried)
CHUNK_EVENTS = 1024  # events compressed per write call (bounds how far a segment overshoots its size limit)


class DeliveryLogError(Exception):
    """The delivery log cannot be opened (bad limits, directory in use by another writer, unreadable state)."""


@dataclass(slots=True)
class Limits:
    """Rotation, durability and disk-budget limits of one writer."""

    segment_bytes: int = 4 << 20  # compressed size of the open segment (its journal) at which it is closed
    segment_age_s: float = 300.0  # age at which a segment is closed (so uploads are never older than this)
    budget_bytes: int = 256 << 20  # this writer's closed + open segments; oldest closed ones are evicted beyond it
    fsync_every_s: float | None = 10.0  # fsync the open segment this often (None: only at close)
    flush_every_s: float = 0.5  # sync-flush the compressor this often: what a SIGKILL can lose at most
    min_free_bytes: int = 32 << 20  # also evict when the filesystem has less free space than this
    level: int = 6  # gzip level of the journal (and of jsonl.gz segments)
    format: str = "parquet"  # closed segments: "parquet" | "jsonl.gz"

    def check(self) -> None:
        """Raise DeliveryLogError for limits that cannot work."""
        if self.segment_bytes < 1024:
            raise DeliveryLogError(f"segment size {self.segment_bytes} B is below 1024 B")
        if self.segment_age_s <= 0:
            raise DeliveryLogError(f"segment age {self.segment_age_s} s must be positive")
        if self.budget_bytes < 2 * self.segment_bytes:
            raise DeliveryLogError(f"disk budget {self.budget_bytes} B must be at least twice the segment size")
        if not 1 <= self.level <= 9:
            raise DeliveryLogError(f"gzip level {self.level} not in 1..9")
        if self.format not in FORMATS:
            raise DeliveryLogError(f"segment format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.format == "parquet":
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError as exc:
                raise DeliveryLogError(f"segment format parquet needs pyarrow: {exc}") from None


@dataclass(slots=True)
class _Open:
    """The segment being written."""

    name: SegmentName
    fd: int
    comp: Any
    opened_mono: float
    size: int = 0
    events: int = 0
    last_counter: int = -1
    dirty: bool = False  # written since the last fsync
    last_fsync: float = 0.0
    unflushed: bool = False  # data in the compressor since the last sync flush
    last_flush: float = 0.0
    columns: ParquetSegment | None = None  # Parquet format: the closed file being built
    columns_size: int = 0  # bytes of its temporary file


@dataclass(slots=True)
class WriterStats:
    """Counters a writer keeps; exposed by DeliveryLog.stats()."""

    events: int = 0
    bytes: int = 0  # compressed bytes written
    segments: int = 0  # segments closed
    evicted_segments: int = 0
    evicted_events: int = 0
    evicted_bytes: int = 0
    lost_events: int = 0  # dropped on write errors or backlog overflow (each recorded as log_evicted)
    bad_fields: int = 0  # fields outside the schema (or, in Parquet, values its type cannot hold), dropped
    parquet_failures: int = 0  # segments closed as jsonl.gz because their Parquet file could not be written
    recovered: list[str] = field(default_factory=list)


def items_of(flat: list[Any]) -> list[Item]:
    """The events of a flat batch [kind, wall, mono, fields, ...] as Items."""
    it = iter(flat)
    return list(zip(it, it, it, it, strict=False))


def message_tuple(msg: Any, full: bool) -> tuple[Any, ...]:
    """A broker Message as plain values (msg_id, publisher, topic, qos, retain, payload size, user properties)."""
    if not full:
        return (msg.msg_id, None, None, None, None, None, ())
    props = getattr(msg, "properties", None)
    user = getattr(props, "user_properties", None) or ()
    return (msg.msg_id, msg.publisher, msg.topic, msg.qos, msg.retain, len(msg.payload), tuple(user))


def _compact_encoder() -> Callable[[Any], str]:
    """The fastest compact JSON encoder available: the C encoder called directly skips json.dumps' set-up per call."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(separators=(",", ":")).encode
    enc = make(None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    join = "".join
    return lambda obj: join(enc(obj, 0))


def _plain(value: Any) -> Any:
    """`value` if JSON can encode it as is, else its text."""
    return value if isinstance(value, (str, int, float, bool)) else str(value)


def _reason_text(value: Any) -> str:
    """A reason as schema text: enum members by lower-case name, anything else by str()."""
    if isinstance(value, Enum):
        return value.name.lower()
    return str(value)


class SegmentWriter:
    """Owns one node's segments in a directory; not thread-safe (one writer thread or process calls it)."""

    def __init__(
        self,
        directory: str,
        identity: Identity,
        limits: Limits,
        clock_synced: Callable[[], bool],
        seq_property: str = "seq",
    ) -> None:
        limits.check()
        self.seq_property = seq_property
        self.directory = directory
        self.identity = identity
        self.limits = limits
        self.stats = WriterStats()
        self._clock_synced = clock_synced
        self._node = safe_node(identity.node)
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(directory, f".{self._node}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DeliveryLogError(f"{directory} is already in use by a writer for node {identity.node!r}") from None
        self._state_path = os.path.join(directory, f".{self._node}.state")
        for name in sorted(os.listdir(directory)):
            parsed = parse_name(name)
            if parsed and parsed.node == self._node and name.endswith(".part"):
                rec = recover_part(directory, name, limits.level, limits.format)
                self.stats.recovered.append(f"{name}: {rec.records} records kept, {rec.dropped_bytes} B dropped")
        for name in os.listdir(directory):  # a temporary Parquet file whose journal is gone has nothing to finish
            parsed = parse_name(name[: -len(".tmp")]) if name.endswith(PARQUET + ".tmp") else None
            if parsed and parsed.node == self._node:
                os.unlink(os.path.join(directory, name))
        self._counter, self._seq = self._load_state()
        self._reserved = self._counter
        self._synced_before = clock_synced()
        self._segment: _Open | None = None
        self._pending: list[Item] = []  # log_evicted records waiting to be written
        self._closed_bytes = sum(s for _, s in self._own_closed())
        ident = json.dumps
        self._prefix = (
            f'{{"schema_version":{SCHEMA_VERSION},"source":{ident(identity.source)},"fleet":{ident(identity.fleet)},'
            f'"device":{ident(identity.device)},"node":{ident(identity.node)},"firmware":{ident(identity.firmware)},'
            f'"boot_id":{ident(identity.boot_id)},"event_id":{ident(identity.node + ":" + identity.boot_id + ":")[:-1]}'
        )
        self._kinds = {k: ident(k) for k in KINDS}
        self._dumps = _compact_encoder()

    # -- state -------------------------------------------------------------------------------------------------

    def _load_state(self) -> tuple[int, int]:
        """Next event counter for this boot and next segment sequence, from the state file and the segments."""
        state: dict[str, Any] = {}
        try:
            with open(self._state_path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            raise DeliveryLogError(f"unreadable delivery-log state {self._state_path}: {exc}") from exc
        counter = int(state.get("next_counter", 0)) if state.get("boot_id") == self.identity.boot_id else 0
        seq = int(state.get("next_segment", 0))
        for name in closed_segments(self.directory):  # the state file may be older than the segments
            parsed = parse_name(name)
            if parsed is None or parsed.node != self._node:
                continue
            seq = max(seq, parsed.seq + 1)
            if parsed.boot_id == self.identity.boot_id and parsed.first_counter >= counter:
                events = segment_events(os.path.join(self.directory, name))
                counter = max(counter, parsed.first_counter + events)
        return counter, seq

    def _save_state(self, next_counter: int, next_segment: int) -> None:
        """Persist the counter reservation and segment sequence before either is used."""
        body = {"boot_id": self.identity.boot_id, "next_counter": next_counter, "next_segment": next_segment}
        atomic_write(self._state_path, json.dumps(body).encode())

    def _reserve(self, upto: int, next_segment: int) -> None:
        """Make sure counters below `upto` are reserved on disk."""
        if upto > self._reserved or next_segment > self._seq:
            self._reserved = max(self._reserved, upto + COUNTER_BLOCK)
            self._save_state(self._reserved, next_segment)
            self._seq = next_segment

    # -- writing -----------------------------------------------------------------------------------------------

    def write(self, items: list[Item]) -> None:
        """Append `items` (in emit order) to the open segment, rotating and enforcing the budget as needed."""
        synced_now = self._clock_synced()
        synced = self._synced_before and synced_now  # synchronised across the whole span the batch was emitted in
        self._synced_before = synced_now
        if self._pending:
            pending, self._pending = self._pending, []
            self._write_chunk(pending, synced_now)
        for start in range(0, len(items), CHUNK_EVENTS):
            self._write_chunk(items[start : start + CHUNK_EVENTS], synced)

    def write_flat(self, flat: list[Any]) -> None:
        """write() for a flat batch [kind, wall, mono, fields, ...]."""
        self.write(items_of(flat))

    def record_loss(self, reason: str, events: int) -> None:
        """Queue a log_evicted record for `events` events lost before reaching the writer."""
        self.stats.lost_events += events
        fields = {"reason": f"{reason} events={events}"}
        self._pending.append(("log_evicted", time.time_ns(), time.monotonic_ns(), fields))

    def _encode(self, items: list[Item], synced: bool, columns: ParquetSegment | None) -> bytes:
        """JSON Lines for `items`, numbered from the current counter; also buffered into `columns` when given."""
        prefix, kinds, dumps, allowed = self._prefix, self._kinds, self._dumps, EMIT_FIELDS
        flag = "true" if synced else "false"
        n = self._counter
        lines = []
        col_kinds: list[str] = []
        col_walls: list[int] = []
        col_monos: list[int] = []
        col_fields: list[dict[str, Any]] = []
        seq_property = self.seq_property
        for kind, wall, mono, fields in items:
            k = kinds.get(kind) or dumps(str(kind))
            if type(fields) is tuple:  # a positional hot event: schema fields only, never None, no reason
                try:
                    fields = fields_of(kind, fields, seq_property)
                except (KeyError, ValueError, IndexError, TypeError):  # not a layout this writer knows
                    self.stats.bad_fields += len(fields)
                    fields = {}
            elif fields:
                if "message" in fields:
                    self._expand(kind, fields)
                if None in fields.values() or not fields.keys() <= allowed:
                    kept = {key: v for key, v in fields.items() if v is not None and key in allowed}
                    self.stats.bad_fields += sum(1 for key in fields if key not in allowed)
                    fields = kept
                reason = fields.get("reason")
                if reason is not None and type(reason) is not str:
                    fields["reason"] = _reason_text(reason)
            tail = "}"
            if fields:
                try:
                    tail = "," + dumps(fields)[1:]
                except (TypeError, ValueError):  # a value JSON cannot hold: keep its text
                    tail = "," + dumps({key: _plain(v) for key, v in fields.items()})[1:]
            wall_us, mono_us = wall // 1000, mono // 1000
            lines.append(
                f'{prefix}{n}","kind":{k},"ts_wall_us":{wall_us},"ts_mono_us":{mono_us},"clock_synced":{flag}{tail}\n'
            )
            if columns is not None:
                col_kinds.append(kind if type(kind) is str else str(kind))
                col_walls.append(wall_us)
                col_monos.append(mono_us)
                col_fields.append(fields)
            n += 1
        if columns is not None:
            columns.add(col_kinds, col_walls, col_monos, synced, col_fields)
        return "".join(lines).encode()

    def _expand(self, kind: str, fields: dict[str, Any]) -> None:
        """Replace a `message=` field (a broker Message or its message_tuple) by schema fields; explicit ones win."""
        msg = fields.pop("message")
        if msg is None:
            return
        msg_id, publisher, topic, qos, retain, size, user_properties = (
            msg if type(msg) is tuple else message_tuple(msg, full=True)
        )
        fields.setdefault("msg_id", msg_id)
        if kind not in FULL_MESSAGE_KINDS:
            return  # the rest joins in from the message's `received` record by msg_id
        fields.setdefault("publisher", publisher or None)
        fields.setdefault("topic", topic)
        fields.setdefault("qos", qos)
        fields.setdefault("retain", retain)
        fields.setdefault("payload_size", size)
        if "publisher_seq" not in fields:
            seq = publisher_seq(user_properties, self.seq_property)
            if seq is not None:
                fields["publisher_seq"] = seq

    def _open(self) -> _Open:
        """Start a new `.part` segment named after its first event counter."""
        name = SegmentName(self._seq, self._node, self.identity.boot_id, self._counter)
        self._reserve(self._counter + CHUNK_EVENTS, self._seq + 1)
        path = os.path.join(self.directory, name.part)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        comp = zlib.compressobj(self.limits.level, zlib.DEFLATED, 31)
        now = time.monotonic()
        seg = _Open(name, fd, comp, now, last_fsync=now, last_flush=now)
        if self.limits.format == "parquet":
            seg.columns = ParquetSegment(os.path.join(self.directory, name.parquet), self.identity, self._counter)
        return seg

    def _write_chunk(self, items: list[Item], synced: bool) -> None:
        """Compress and append one chunk (whole deflate blocks reach the file as they fill; sync() forces the rest)."""
        if not items:
            return
        seg = self._segment
        try:
            if seg is None:
                seg = self._segment = self._open()
            self._reserve(self._counter + len(items), self._seq)
            data = seg.comp.compress(self._encode(items, synced, seg.columns))
            if data:
                write_all(seg.fd, data)
        except OSError as exc:
            self._fail(seg, exc, len(items))
            return
        if seg.columns is not None:
            self.stats.bad_fields += seg.columns.bad_values
            seg.columns.bad_values = 0
            if seg.columns.buffered >= ROW_GROUP_EVENTS:
                try:
                    while seg.columns.buffered >= ROW_GROUP_EVENTS:
                        seg.columns.flush_row_group()
                    seg.columns_size = seg.columns.tmp_size()
                except Exception:  # disk full, or pyarrow failed: this segment closes as jsonl.gz
                    self._drop_columns(seg)
        self._counter += len(items)
        seg.size += len(data)
        seg.events += len(items)
        seg.last_counter = self._counter - 1
        seg.dirty = seg.unflushed = True
        self.stats.events += len(items)
        self.stats.bytes += len(data)
        if seg.size >= self.limits.segment_bytes:
            self.rotate()
        else:
            self._enforce_budget()

    def _fail(self, seg: _Open | None, exc: OSError, events: int) -> None:
        """A write failed: cut the segment back to its last good byte, close it, and record the loss."""
        if seg is not None:
            try:
                os.ftruncate(seg.fd, seg.size)
            except OSError:
                pass
            os.close(seg.fd)
            self._segment = None
            if seg.columns is not None:
                self._drop_columns(seg)
            try:
                rec = recover_part(self.directory, seg.name.part, self.limits.level, self.limits.format)
                events += seg.events - rec.records  # records compressed but never written
            except OSError:
                pass  # left as .part: its good records are recovered at the next start
        self.record_loss(f"write_error {errno.errorcode.get(exc.errno or 0, exc.errno)}", events)

    def sync(self) -> None:
        """Sync-flush the compressor: every record written so far is in the file (readable after a SIGKILL)."""
        if self._pending:
            self.write([])
        seg = self._segment
        if seg is None or not seg.unflushed:
            return
        try:
            data = seg.comp.flush(zlib.Z_SYNC_FLUSH)
            write_all(seg.fd, data)
        except OSError as exc:
            self._fail(seg, exc, 0)
            return
        seg.size += len(data)
        self.stats.bytes += len(data)
        seg.unflushed = False
        seg.last_flush = time.monotonic()

    def tick(self) -> None:
        """Time-driven work: write queued loss records, close an aged segment, sync-flush and fsync a dirty one."""
        if self._pending:
            self.write([])
        seg = self._segment
        if seg is None:
            return
        now = time.monotonic()
        if now - seg.opened_mono >= self.limits.segment_age_s:
            self.rotate()
            return
        if seg.unflushed and now - seg.last_flush >= self.limits.flush_every_s:
            self.sync()
        if seg.dirty and self.limits.fsync_every_s is not None and now - seg.last_fsync >= self.limits.fsync_every_s:
            os.fsync(seg.fd)
            seg.dirty = False
            seg.last_fsync = now

    def rotate(self) -> None:
        """Close the open segment: finish the gzip stream, fsync, rename `.part` to its final name."""
        seg, self._segment = self._segment, None
        if seg is None:
            return
        try:
            tail = seg.comp.flush(zlib.Z_FINISH)
            write_all(seg.fd, tail)
            os.fsync(seg.fd)
        except OSError as exc:
            self._fail(seg, exc, 0)
            return
        os.close(seg.fd)
        seg.size += len(tail)
        self.stats.bytes += len(tail)
        part = os.path.join(self.directory, seg.name.part)
        size = seg.size
        if seg.columns is not None:
            try:
                size = seg.columns.finish()  # fsynced and renamed: the journal is no longer needed
            except Exception:  # disk full, or pyarrow failed: the journal becomes the segment
                self._drop_columns(seg)
            else:
                self.stats.bad_fields += seg.columns.bad_values
                os.unlink(part)
                fsync_dir(self.directory)
        if seg.columns is None:
            os.rename(part, os.path.join(self.directory, seg.name.final))
            fsync_dir(self.directory)
        self.stats.segments += 1
        self._closed_bytes += size
        self._enforce_budget()

    def _drop_columns(self, seg: _Open) -> None:
        """Give up the segment's Parquet file (its journal still holds every record); counted in the stats."""
        if seg.columns is not None:
            seg.columns.abort()
            seg.columns = None
            seg.columns_size = 0
            self.stats.parquet_failures += 1

    # -- disk budget -------------------------------------------------------------------------------------------

    def _own_closed(self) -> list[tuple[str, int]]:
        """This node's closed segments, oldest first, with their sizes."""
        out = []
        for name in closed_segments(self.directory):
            parsed = parse_name(name)
            if parsed is not None and parsed.node == self._node:
                try:
                    out.append((name, os.stat(os.path.join(self.directory, name)).st_size))
                except FileNotFoundError:
                    pass  # uploaded and deleted meanwhile
        return out

    def _free_bytes(self) -> int:
        """Bytes the filesystem still gives us."""
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize

    def _enforce_budget(self) -> None:
        """Evict the oldest closed segments while over the budget or short of free disk; record each eviction."""
        open_size = self._segment.size + self._segment.columns_size if self._segment else 0  # journal + Parquet tmp
        over_budget = self._closed_bytes + open_size > self.limits.budget_bytes
        if not over_budget and self._free_bytes() >= self.limits.min_free_bytes:
            return
        closed = self._own_closed()  # the uploader may have deleted some since we last looked
        self._closed_bytes = sum(s for _, s in closed)
        evicted = False
        for name, size in closed:
            if self._closed_bytes + open_size > self.limits.budget_bytes:
                why = "disk_budget"
            elif self._free_bytes() < self.limits.min_free_bytes:
                why = "disk_free"
            else:
                break
            events, first, last, carried = self._segment_extent(name)
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                self._closed_bytes -= size  # uploaded meanwhile: not lost
                continue
            evicted = True
            self._closed_bytes -= size
            self.stats.evicted_segments += 1
            self.stats.evicted_events += events
            self.stats.evicted_bytes += size
            parsed = parse_name(name)
            boot = parsed.boot_id if parsed else "?"
            node = self.identity.node
            reason = (
                f"{why} events={events} bytes={size} segment={name} "
                f"first_event={node}:{boot}:{first} last_event={node}:{boot}:{last}"
            )
            now_wall, now_mono = time.time_ns(), time.monotonic_ns()
            for text in [*carried, reason]:  # earlier eviction records in the evicted segment are carried forward
                self._pending.append(("log_evicted", now_wall, now_mono, {"reason": text}))
        if evicted:
            fsync_dir(self.directory)

    def _segment_extent(self, name: str) -> tuple[int, int, int, list[str]]:
        """Events, first and last counter of a closed segment, and the reasons of the eviction records it holds."""
        parsed = parse_name(name)
        first = parsed.first_counter if parsed else 0
        path = os.path.join(self.directory, name)
        try:
            events, carried = segment_events(path), eviction_reasons(path)
        except (OSError, ValueError):  # unreadable (pyarrow's errors are OSError or ValueError)
            events, carried = 0, []
        return events, first, first + events - 1, carried

    def close(self) -> None:
        """Write pending loss records, close the open segment and release the directory lock."""
        if self._pending:
            self.write([])
        self.rotate()
        for _ in range(CLOSE_ROUNDS):  # a closing rotation evicted something: record it in one more segment
            if not self._pending:
                break
            self.write([])
            self.rotate()
        os.close(self._lock_fd)
