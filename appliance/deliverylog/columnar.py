"""Closed segments as Parquet (zstd, dictionary and delta encodings), built row group by row group from the journal."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .batch import NULLABLE, Lanes, column_array, lanes_columns, nullable_columns
from .identity import Identity
from .journal import Journal
from .schema import FIELDS, IDENTITY_FIELDS, SCHEMA_VERSION

ROW_GROUP_EVENTS = 65_536  # rows per row group: bounds the writer's memory, keeps dictionaries and deltas effective
_ARROW_TYPES = {"string": "string", "int": "int32", "long": "int64", "boolean": "bool_"}
WRITER_COLUMNS = ("event_id", "ts_wall_us", "ts_mono_us", "clock_synced", "kind")
# Unique or ever-growing columns: no dictionary; strings share prefixes, clocks and counters grow by small steps.
_DELTA = {"event_id": "DELTA_BYTE_ARRAY", "ts_wall_us": "DELTA_BINARY_PACKED", "ts_mono_us": "DELTA_BINARY_PACKED"}
# Constant per file (the identity): the string ones go in as one-value Arrow dictionaries, nothing hashed per row.
_DICTIONARY_CONSTANTS = tuple(name for name in IDENTITY_FIELDS if FIELDS[name][0] == "string")
# Min/max statistics where a reader prunes by them (time ranges, kinds, whose file); string statistics over every
# message id, client id and topic cost a third of the encoding and no query filters on them.
STATISTICS_COLUMNS = ("ts_wall_us", "ts_mono_us", "kind", *IDENTITY_FIELDS)
# A message id repeats only on its own message's few events: a dictionary of them costs time and, as its indices
# compress worse than the ids' shared prefixes, also bytes.
_PLAIN = ("msg_id",)
WRITE_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": [name for name in FIELDS if name not in _DELTA and name not in _PLAIN],
    "column_encoding": _DELTA,
    "write_statistics": list(STATISTICS_COLUMNS),
    "write_batch_size": ROW_GROUP_EVENTS,  # a row group's column in one pass (the default, 1024 rows, loops 64x)
    "store_schema": False,  # the Parquet types say it all; saves ~2 KiB per file
}


def arrow_schema() -> Any:
    """Schema v1 as an Arrow schema: exact types, required (non-null) where the schema says so."""
    import pyarrow as pa

    return pa.schema(
        [pa.field(name, getattr(pa, _ARROW_TYPES[t])(), nullable=nullable) for name, (t, nullable) in FIELDS.items()]
    )


def _file_schema(schema: Any) -> Any:
    """`schema` as the Parquet writer takes it: kind and the constant strings as dictionaries (strings in the file)."""
    import pyarrow as pa

    dictionary = pa.dictionary(pa.int32(), pa.string())
    return pa.schema([field.with_type(dictionary) if field.name in (*_DICTIONARY_CONSTANTS, "kind") else field
                      for field in schema])


class ParquetSegment:
    """One segment's Parquet file under construction at `<final>.tmp`; renamed to its final name when complete.

    Each chunk of events becomes an Arrow batch at once (the Python work is spread evenly); full row groups are
    encoded and written by a helper thread (pyarrow releases the GIL), so the writer never stalls for a row group.
    """

    def __init__(self, final_path: str, identity: Identity, first_counter: int) -> None:
        import pyarrow as pa
        import pyarrow.compute  # loads pa.compute

        self._pa = pa
        self.final_path = final_path
        self.tmp_path = final_path + ".tmp"
        self.schema = arrow_schema()
        self._file_schema = _file_schema(self.schema)
        self._kind_type = self._file_schema.field("kind").type
        self._nullable = pa.struct([self.schema.field(name) for name in NULLABLE])
        self.identity = identity
        self.event_prefix = f"{identity.node}:{identity.boot_id}:"
        self.next_counter = first_counter  # event counter of the next row added
        self.rows = 0  # rows handed to the file so far
        self.bad_values = 0  # values dropped because the schema type cannot hold them
        self.buffered = 0  # rows waiting for the next row group
        self._batches: list[Any] = []
        self._writer: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None  # the row group being written

    def tmp_size(self) -> int:
        """Bytes of the temporary file on disk."""
        try:
            return os.path.getsize(self.tmp_path)
        except FileNotFoundError:
            return 0

    def add(self, kinds: list[str], walls: list[int], monos: list[int], synced: bool | list[bool],
            fields: list[dict[str, Any]], event_ids: list[str] | None = None) -> None:
        """Buffer one chunk of events given as field dicts (numbered from next_counter unless event_ids are given)."""
        if not kinds:
            return
        pa = self._pa
        try:  # one C++ pass over the field dicts
            nullable = pa.array(fields, self._nullable).flatten()
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            nullable = []
            for name in NULLABLE:  # some value does not fit its column: find it, column by column
                array, bad = column_array(pa, name, [r.get(name) for r in fields], self.schema.field(name).type)
                nullable.append(array)
                self.bad_values += bad
        self._append(kinds, pa.array(walls, pa.int64()), pa.array(monos, pa.int64()), synced, nullable, event_ids)

    def add_flat(self, flat: list[Any], synced: bool, seq_property: str) -> int:
        """Buffer a flat batch [kind, wall ns, mono ns, fields, ...] column by column; returns fields dropped."""
        if not flat:
            return 0
        pa = self._pa
        kinds = flat[0::4]
        nullable, dropped = nullable_columns(pa, kinds, flat[3::4], seq_property)
        walls = pa.compute.divide(pa.array(flat[1::4], pa.int64()), 1000)  # integer division: ns -> us
        monos = pa.compute.divide(pa.array(flat[2::4], pa.int64()), 1000)
        self._append(kinds, walls, monos, synced, nullable, None)
        return dropped

    def add_lanes(self, lanes: Lanes, offset: int, synced: bool, seq_property: str) -> int:
        """Buffer a lanes batch (wall = mono + `offset`) column by column, in emit order; returns fields dropped."""
        kinds, monos, nullable, dropped = lanes_columns(self._pa, lanes, seq_property)
        if len(kinds):
            pc = self._pa.compute
            walls = pc.divide(pc.add(monos, offset), 1000)  # integer division: ns -> us
            self._append(kinds, walls, pc.divide(monos, 1000), synced, nullable, None)
        return dropped

    def _append(self, kinds: Any, walls: Any, monos: Any, synced: bool | list[bool], nullable: list[Any],
                event_ids: list[str] | None) -> None:
        """Buffer one chunk as an Arrow batch of the writer's columns and the nullable ones."""
        pa = self._pa
        n = len(kinds)
        if event_ids is not None:
            ids = pa.array(event_ids, pa.string())
        else:  # next_counter, next_counter + 1, ... without a Python int per row
            counters = pa.compute.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n), start=self.next_counter - 1)
            ids = pa.compute.binary_join_element_wise(self.event_prefix, counters.cast(pa.string()), "")
        if isinstance(kinds, pa.Array):
            kind_array = kinds
        else:
            try:
                kind_array = pa.array(kinds, pa.string())
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                kind_array = pa.array([str(k) for k in kinds], pa.string())
        if kind_array.type != self._kind_type:
            kind_array = kind_array.dictionary_encode()
        self._batches.append(pa.RecordBatch.from_arrays([
            ids, walls, monos,
            pa.array(synced, pa.bool_()) if isinstance(synced, list) else pa.repeat(pa.scalar(synced), n),
            kind_array, *nullable,
        ], names=[*WRITER_COLUMNS, *NULLABLE]))
        self.next_counter += n
        self.buffered += n

    def _table(self, chunks: Any) -> Any:
        """The buffered chunks (one Arrow table) as the file's table: the identity's constant columns filled in."""
        pa = self._pa
        n = chunks.num_rows
        ident = self.identity
        columns: dict[str, Any] = {name: chunks[name] for name in (*WRITER_COLUMNS, *NULLABLE)}
        columns["schema_version"] = pa.repeat(pa.scalar(SCHEMA_VERSION, pa.int32()), n)
        first = pa.repeat(pa.scalar(0, pa.int32()), n)  # every row: the dictionary's only value
        for name in _DICTIONARY_CONSTANTS:
            columns[name] = pa.DictionaryArray.from_arrays(first, pa.array([getattr(ident, name)], pa.string()))
        return pa.Table.from_arrays([columns[f.name] for f in self._file_schema], schema=self._file_schema)

    def flush_row_group(self, limit: int = ROW_GROUP_EVENTS) -> None:
        """Hand up to `limit` buffered rows to the helper thread as one row group (the file opens on the first)."""
        n = min(self.buffered, limit)
        if not n:
            return
        chunks = self._pa.Table.from_batches(self._batches)
        rest = chunks.slice(n)
        self._batches = rest.to_batches() if rest.num_rows else []
        self.buffered -= n
        self.rows += n
        self._wait()  # one row group in flight at a time: ParquetWriter is not thread-safe
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="deliverylog-parquet")
        self._pending = self._pool.submit(self._write, chunks.slice(0, n))

    def _write(self, chunks: Any) -> None:
        """Assemble, encode and write one row group (helper thread)."""
        table = self._table(chunks)
        if self._writer is None:
            import pyarrow.parquet as pq

            self._writer = pq.ParquetWriter(self.tmp_path, self._file_schema, **WRITE_OPTIONS)
        self._writer.write_table(table, row_group_size=table.num_rows)

    def _wait(self) -> None:
        """Wait for the row group in flight; its error (disk full, ...) is raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def finish(self) -> int:
        """Write the rest, close the file, fsync it and rename it to its final name; returns its size (0: no rows)."""
        from .segments import fsync_dir

        while self.buffered:
            self.flush_row_group()
        self._wait()
        self._stop_pool()
        if self._writer is None:
            return 0
        self._writer.close()
        self._writer = None
        fd = os.open(self.tmp_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(self.tmp_path, self.final_path)
        fsync_dir(os.path.dirname(self.final_path) or ".")
        return os.path.getsize(self.final_path)

    def abort(self) -> None:
        """Drop the temporary file (the journal still holds every record)."""
        try:
            self._wait()
        except Exception:  # the file is deleted anyway
            pass
        self._stop_pool()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # the file is deleted anyway
                pass
            self._writer = None
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass


def warm_up() -> None:
    """Make once the Arrow calls a segment makes (first use imports pandas into pyarrow and sets up its kernels).

    The writer child runs this right after start-up so that the first batches do not pay for it (a stall of ~0.2 s,
    seconds at nice 19 on a busy core, while the broker's batches pile up in the pipe).
    """
    import pyarrow as pa

    seg = ParquetSegment("", Identity("f", "d", "n", "1", "b"), 0)
    flat = ["received", 2_000, 1_000, ("m", "p", "t", 1, False, 3, [("seq", "1")], 7),
            "routed", 2_000, 1_000, ("m", "s", "t/#", 1), "dropped", 2_000, 1_000, {"msg_id": "m", "reason": "x"}]
    seg.add_flat(flat, True, "seq")
    table = seg._table(pa.Table.from_batches(seg._batches))
    import pyarrow.parquet as pq

    with pq.ParquetWriter(pa.BufferOutputStream(), seg._file_schema, **WRITE_OPTIONS) as writer:
        writer.write_table(table, row_group_size=table.num_rows)


def records_to_parquet(records: list[dict[str, Any]], final_path: str) -> tuple[int, int]:
    """Write decoded journal records (already numbered) as a Parquet segment; returns (size, values dropped)."""
    if not records:
        return 0, 0
    first = records[0]
    identity = Identity(
        str(first.get("fleet")), str(first.get("device")), str(first.get("node")), str(first.get("firmware")),
        str(first.get("boot_id")), str(first.get("source", "broker")),
    )
    seg = ParquetSegment(final_path, identity, 0)
    for start in range(0, len(records), 1024):
        chunk = records[start : start + 1024]
        seg.add([str(r.get("kind")) for r in chunk], [r.get("ts_wall_us") for r in chunk],  # type: ignore[misc]
                [r.get("ts_mono_us") for r in chunk], [bool(r.get("clock_synced")) for r in chunk],  # type: ignore[misc]
                chunk, [str(r.get("event_id")) for r in chunk])
        if seg.buffered >= ROW_GROUP_EVENTS:
            seg.flush_row_group()
    try:
        size = seg.finish()
    except BaseException:
        seg.abort()
        raise
    return size, seg.bad_values


def _journal_segment(journal: Journal, final_path: str, flush: bool) -> ParquetSegment:
    """A ParquetSegment holding a binary journal's good batches (row groups written as they fill when `flush`)."""
    head = dict(journal.identity or {})
    seq_property = str(head.pop("seq_property", "seq"))
    seg = ParquetSegment(final_path, Identity(**head), journal.first_counter)
    for batch in journal.batches:
        seg.bad_values += seg.add_flat(batch.flat, batch.synced, seq_property)
        if flush and seg.buffered >= ROW_GROUP_EVENTS:
            seg.flush_row_group()
    return seg


def journal_to_parquet(journal: Journal, final_path: str) -> tuple[int, int]:
    """Write a binary journal's good batches as a Parquet segment; returns (size, values dropped)."""
    seg = _journal_segment(journal, final_path, flush=True)
    try:
        size = seg.finish()
    except BaseException:
        seg.abort()
        raise
    return size, seg.bad_values


def journal_records(journal: Journal) -> list[dict[str, Any]]:
    """A binary journal's good records as a Parquet segment would give them back."""
    if not journal.batches:
        return []
    seg = _journal_segment(journal, "", flush=False)
    table = seg._table(seg._pa.Table.from_batches(seg._batches))
    return _without_nulls(table.to_pylist())


def _without_nulls(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with absent (null) nullable fields left out, like in a JSON line."""
    return [{k: v for k, v in row.items() if v is not None or not FIELDS.get(k, ("", True))[1]} for row in rows]


def read_parquet_records(path: str) -> list[dict[str, Any]]:
    """The records of a Parquet segment, in file order, absent (null) nullable fields left out like in a JSON line."""
    import pyarrow.parquet as pq

    return _without_nulls(pq.read_table(path).to_pylist())


def parquet_rows(path: str) -> int:
    """Rows of a Parquet segment, from its footer alone."""
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def parquet_eviction_reasons(path: str) -> list[str]:
    """The reasons of the log_evicted records a Parquet segment holds (reads two columns only)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["kind", "reason"])
    return [str(r) for k, r in zip(table["kind"].to_pylist(), table["reason"].to_pylist(), strict=True)
            if k == "log_evicted" and r]


def parquet_first_record(path: str) -> dict[str, Any]:
    """fleet, device and ts_wall_us of a Parquet segment's first row (reads the first row group's three columns)."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    if f.metadata.num_row_groups == 0 or f.metadata.num_rows == 0:
        raise ValueError("Parquet segment has no rows")
    table = f.read_row_group(0, columns=["fleet", "device", "ts_wall_us"])
    return {name: table[name][0].as_py() for name in ("fleet", "device", "ts_wall_us")}
