"""Turns batches of emitted events into rotated, crash-safe segments (Parquet or gzip JSON Lines) under a disk budget.

In jsonl.gz format the open segment is the gzip JSON Lines stream itself, sync-flushed and fsynced. In Parquet
format it is a binary journal (journal.py: one checksummed marshal frame per batch, in the file as soon as written)
while the batch's columns are built kind by kind (batch.py) into row groups of a `.parquet.tmp`, which is fsynced and
renamed when the segment closes, then the journal is deleted. A crash leaves the journal, from which the segment is
rebuilt at the next start.
"""

from __future__ import annotations

import errno
import fcntl
import json
import json.encoder
import marshal
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import chain
from typing import Any

from .batch import (
    FULL_MESSAGE_KINDS,
    ITEM_LEN,
    Item,
    Lanes,
    event_fields,
    items_of,
    lane_counts,
    lanes_flat,
    message_tuple,
    pack,
    pack_lanes,
    with_recorded,
)
from .columnar import ROW_GROUP_EVENTS, ParquetSegment
from .identity import Identity
from .journal import LANES, batch_frame, header
from .limits import DeliveryLogError, Limits, WriterStats
from .schema import KINDS, SCHEMA_VERSION
from .segments import (
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

__all__ = ["FULL_MESSAGE_KINDS", "ITEM_LEN", "DeliveryLogError", "Item", "Limits", "SegmentWriter", "WriterStats",
           "items_of", "message_tuple"]

COUNTER_BLOCK = 1 << 20  # event counters reserved per state write; a crash skips at most this many ids
CLOSE_ROUNDS = 32  # segments close() may add for eviction records (each may evict an older one, whose are carried)
CHUNK_EVENTS = 1024  # events compressed per write call (bounds how far a segment overshoots its size limit)
COLUMN_EVENTS = 16_384  # journaled events whose Parquet columns are built in one go (fewer, larger Arrow calls)


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
    unbuilt: list[Any] = field(default_factory=list)  # journaled flat batches / _Lanes whose columns are not built

    unbuilt_events: int = 0
    unbuilt_synced: bool = True  # their clock-sync flag (a change of flag builds the earlier ones first)


@dataclass(slots=True)
class _Lanes:
    """A journaled lanes batch waiting for its columns."""

    lanes: Lanes
    offset: int


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
        self._binary = limits.format == "parquet"  # the open segment is a binary journal (journal.py)

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

    def _synced(self) -> tuple[bool, bool]:
        """(clock synchronised across the span the batch was emitted in, synchronised now)."""
        synced_now = self._clock_synced()
        synced = self._synced_before and synced_now
        self._synced_before = synced_now
        return synced, synced_now

    def write(self, items: list[Item], stepped: bool = False) -> None:
        """Append `items` (in emit order) to the open segment, rotating and enforcing the budget as needed.

        `stepped`: the wall clock stepped while they were emitted (their records say clock_synced=false).
        """
        if self._binary:
            self._write_batch([entry for item in items for entry in item], None, stepped=stepped)
            return
        synced, synced_now = self._synced()
        if self._pending:
            pending, self._pending = self._pending, []
            self._write_chunk(pending, synced_now)
        for start in range(0, len(items), CHUNK_EVENTS):
            self._write_chunk(items[start : start + CHUNK_EVENTS], synced and not stepped)

    def write_flat(self, flat: list[Any]) -> None:
        """write() for a flat batch [kind, wall, mono, fields, ...]."""
        if self._binary:
            self._write_batch(flat, None)
        else:
            self.write(items_of(flat))

    def write_packed(self, packed: bytes) -> None:
        """write() for a flat batch as batch.pack() marshalled it (in Parquet format journaled as it is)."""
        flat = marshal.loads(packed)
        if self._binary:
            self._write_batch(flat, packed)
        else:
            self.write(items_of(flat))

    def write_lanes(self, lanes: Lanes, offset: int, stepped: bool, recorded: bytes = b"") -> None:
        """write() for a lanes batch (DeliveryLog's drain, batch.lanes_flat), its clock offset and step flag, and
        the C recorder's bytes of more events."""
        lanes = with_recorded(lanes, recorded)
        try:
            packed = marshal.dumps((offset, stepped, lanes), 4)
        except ValueError:  # a non-builtin value: columns from what the journal holds (builtins)
            self.write_lanes_packed(pack_lanes(lanes, offset, stepped))
            return
        self._write_lanes(lanes, packed, offset, stepped)

    def write_lanes_packed(self, packed: bytes) -> None:
        """write() for a marshalled (offset, stepped, lanes batch) (in Parquet format journaled as it is, LANES)."""
        offset, stepped, lanes = marshal.loads(packed)
        self._write_lanes(lanes, packed, offset, stepped)

    def _write_lanes(self, lanes: Lanes, packed: bytes, offset: int, stepped: bool) -> None:
        """write() for a lanes batch and its marshal (offset, stepped, lanes)."""
        if self._binary:
            lane_counts(lanes)  # a batch that does not parse fails here, before the journal holds it
            self._write_batch(lanes, packed, stepped=stepped, offset=offset)
        else:
            self.write(items_of(lanes_flat(lanes, offset)), stepped)

    def record_loss(self, reason: str, events: int) -> None:
        """Queue a log_evicted record for `events` events lost before reaching the writer."""
        self.stats.lost_events += events
        fields = {"reason": f"{reason} events={events}"}
        self._pending.append(("log_evicted", time.time_ns(), time.monotonic_ns(), fields))

    def _write_batch(self, batch: list[Any], packed: bytes | None, stepped: bool = False,
                     offset: int | None = None) -> None:
        """Parquet format: journal pending loss records and then `batch` as binary frames, buffering their columns.

        `batch` is a flat batch and `packed` None or its marshal; or, with an `offset`, a lanes batch and `packed`
        the (offset, stepped, lanes) it came as.
        """
        synced, synced_now = self._synced()
        if self._pending:
            pending, self._pending = self._pending, []
            self._write_frame([entry for item in pending for entry in item], None, synced_now)
        if batch:
            self._write_frame(batch, packed, synced and not stepped, offset)

    def _write_frame(self, batch: list[Any], packed: bytes | None, synced: bool, offset: int | None = None) -> None:
        """Append one batch to the binary journal (one frame) and to the segment's Parquet columns."""
        unbuilt: list[Any] | _Lanes
        if offset is not None:
            assert packed is not None
            n, layout, unbuilt = sum(lane_counts(batch)), LANES, _Lanes(batch, offset)
        else:
            if packed is None:
                try:
                    packed = marshal.dumps(batch, 4)
                except ValueError:  # non-builtin values (thread mode): columns from what the journal holds
                    packed = pack(batch)
                    batch = marshal.loads(packed)
            n, layout, unbuilt = len(batch) // ITEM_LEN, 0, batch
        if not n:
            return
        seg = self._segment
        try:
            if seg is None:
                seg = self._segment = self._open()
            self._reserve(self._counter + n, self._seq)
            data = batch_frame(self._counter, synced, packed, layout)
            write_all(seg.fd, data)
        except OSError as exc:
            self._fail(seg, exc, n)
            return
        if seg.columns is not None:
            if seg.unbuilt and synced != seg.unbuilt_synced:
                self._build_columns(seg)
            seg.unbuilt.append(unbuilt)
            seg.unbuilt_events += n
            seg.unbuilt_synced = synced
            if seg.unbuilt_events >= COLUMN_EVENTS:
                self._build_columns(seg)
        self._advance(seg, n, len(data))

    def _build_columns(self, seg: _Open) -> None:
        """Turn the journaled batches not yet in the segment's Parquet columns into columns (and full row groups)."""
        if seg.columns is None or not seg.unbuilt:
            return
        batches, seg.unbuilt, seg.unbuilt_events = seg.unbuilt, [], 0
        columns, synced, seq_property = seg.columns, seg.unbuilt_synced, self.seq_property
        try:
            flats: list[list[Any]] = []  # consecutive flat batches go in one call
            for batch in [*batches, None]:
                if type(batch) is list:
                    flats.append(batch)
                    continue
                if flats:
                    flat = flats[0] if len(flats) == 1 else list(chain.from_iterable(flats))
                    self.stats.bad_fields += columns.add_flat(flat, synced, seq_property)
                    flats = []
                if isinstance(batch, _Lanes):
                    self.stats.bad_fields += columns.add_lanes(batch.lanes, batch.offset, synced, seq_property)
            while seg.columns.buffered >= ROW_GROUP_EVENTS:
                seg.columns.flush_row_group()
            seg.columns_size = seg.columns.tmp_size()
        except Exception:  # disk full, or pyarrow failed: this segment closes as jsonl.gz
            self._drop_columns(seg)

    def _advance(self, seg: _Open, events: int, size: int) -> None:
        """Count `events` written as `size` bytes to the open segment; rotate it when full."""
        self._counter += events
        seg.size += size
        seg.events += events
        seg.last_counter = self._counter - 1
        seg.dirty = True
        self.stats.events += events
        self.stats.bytes += size
        if seg.size >= self.limits.segment_bytes:
            self.rotate()
        else:
            self._enforce_budget()

    def _encode(self, items: list[Item], synced: bool) -> bytes:
        """JSON Lines for `items`, numbered from the current counter."""
        prefix, kinds, dumps = self._prefix, self._kinds, self._dumps
        flag = "true" if synced else "false"
        n = self._counter
        lines = []
        seq_property = self.seq_property
        for kind, wall, mono, values in items:
            k = kinds.get(kind) or dumps(str(kind))
            fields, bad = event_fields(kind, values, seq_property)
            if bad:
                self.stats.bad_fields += bad
            tail = "}"
            if fields:
                try:
                    tail = "," + dumps(fields)[1:]
                except (TypeError, ValueError):  # a value JSON cannot hold: keep its text
                    tail = "," + dumps({key: _plain(v) for key, v in fields.items()})[1:]
            lines.append(
                f'{prefix}{n}","kind":{k},"ts_wall_us":{wall // 1000},"ts_mono_us":{mono // 1000},'
                f'"clock_synced":{flag}{tail}\n'
            )
            n += 1
        return "".join(lines).encode()

    def _open(self) -> _Open:
        """Start a new `.part` segment named after its first event counter."""
        name = SegmentName(self._seq, self._node, self.identity.boot_id, self._counter)
        self._reserve(self._counter + CHUNK_EVENTS, self._seq + 1)
        path = os.path.join(self.directory, name.part)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        now = time.monotonic()
        if not self._binary:
            return _Open(name, fd, zlib.compressobj(self.limits.level, zlib.DEFLATED, 31), now, last_fsync=now,
                         last_flush=now)
        seg = _Open(name, fd, None, now, last_fsync=now, last_flush=now)
        head = header({**asdict(self.identity), "seq_property": self.seq_property}, self._counter)
        try:
            write_all(fd, head)
        except OSError:
            os.close(fd)
            raise
        seg.size = len(head)
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
            data = seg.comp.compress(self._encode(items, synced))
            if data:
                write_all(seg.fd, data)
        except OSError as exc:
            self._fail(seg, exc, len(items))
            return
        seg.unflushed = True
        self._advance(seg, len(items), len(data))

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
            tail = seg.comp.flush(zlib.Z_FINISH) if seg.comp is not None else b""
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
        self._build_columns(seg)
        if seg.columns is not None:
            try:
                size = seg.columns.finish()  # fsynced and renamed: the journal is no longer needed
            except Exception:  # disk full, or pyarrow failed: the journal becomes the segment
                self._drop_columns(seg)
            else:
                self.stats.bad_fields += seg.columns.bad_values
                os.unlink(part)
                fsync_dir(self.directory)
        if seg.columns is None and seg.comp is None:  # a binary journal whose Parquet failed: rewrite as jsonl.gz
            rec = recover_part(self.directory, seg.name.part, self.limits.level, "jsonl.gz")
            size = os.path.getsize(os.path.join(self.directory, rec.final)) if rec.final else 0
        elif seg.columns is None:
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
            seg.unbuilt, seg.unbuilt_events = [], 0
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
