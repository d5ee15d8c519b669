"""Segment files on disk: names, crash-safe file helpers, tolerant reading and recovery of truncated `.part` files.

The open segment (`.jsonl.gz.part`) is a gzip JSON Lines journal, or in Parquet format a binary one (journal.py);
a closed segment is `.jsonl.gz` or `.parquet` depending on the writer's format.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .journal import is_journal, read_journal
from .schema import normalized

SUFFIX = ".jsonl.gz"
PARQUET = ".parquet"
PART = SUFFIX + ".part"
FORMATS = ("parquet", "jsonl.gz")
CLOSED_SUFFIXES = (SUFFIX, PARQUET)
_GZIP_WBITS = 31  # zlib with a gzip header and trailer
_READ_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class SegmentName:
    """The parts of `<seq>_<node>_<boot_id>_<first counter>.jsonl.gz`; fixed at creation, so upload keys are stable."""

    seq: int  # per node and directory, increasing across boots: the age order eviction uses
    node: str  # percent-encoded node name
    boot_id: str
    first_counter: int

    @property
    def final(self) -> str:
        """File name of the closed segment."""
        return f"{self.seq:010d}_{self.node}_{self.boot_id}_{self.first_counter:012d}{SUFFIX}"

    @property
    def part(self) -> str:
        """File name while the segment is being written (the journal)."""
        return self.final + ".part"

    @property
    def parquet(self) -> str:
        """File name of the closed segment in Parquet format."""
        return self.final[: -len(SUFFIX)] + PARQUET

    def closed(self, fmt: str) -> str:
        """File name of the closed segment in format `fmt`."""
        return self.parquet if fmt == "parquet" else self.final


def safe_node(node: str) -> str:
    """`node` percent-encoded so it is one path component that never contains the separator's meaning."""
    return quote(node, safe="-.")


def parse_name(file_name: str) -> SegmentName | None:
    """The SegmentName of a segment or part file name, or None for any other file."""
    if file_name.endswith(PART):
        stem = file_name[: -len(PART)]
    elif file_name.endswith(SUFFIX):
        stem = file_name[: -len(SUFFIX)]
    elif file_name.endswith(PARQUET):
        stem = file_name[: -len(PARQUET)]
    else:
        return None
    head, _, counter = stem.rpartition("_")
    head, _, boot_id = head.rpartition("_")
    seq, _, node = head.partition("_")
    if not (seq.isdigit() and counter.isdigit() and node and boot_id):
        return None
    return SegmentName(int(seq), node, boot_id, int(counter))


def closed_segments(directory: str) -> list[str]:
    """Closed segment file names in `directory`, oldest first (by segment sequence, then name)."""
    names = [n for n in os.listdir(directory) if n.endswith(CLOSED_SUFFIXES) and parse_name(n) is not None]
    return sorted(names, key=lambda n: (parse_name(n).seq, n))  # type: ignore[union-attr]


def fsync_dir(directory: str) -> None:
    """Make renames and unlinks in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_synced(path: str, data: bytes) -> None:
    """Create or truncate `path`, write all of `data` and fsync it (the first half of every atomic write here)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves either the old or the new content."""
    tmp = path + ".tmp"
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


@dataclass(slots=True)
class SegmentContent:
    """What a segment file holds: its good records and whether the gzip stream ended cleanly."""

    records: list[dict[str, Any]]
    complete: bool  # gzip trailer present and verified, nothing left over
    good_bytes: int  # uncompressed bytes of the complete, parseable lines


def _feed(decomp: Any, chunk: bytes, out: list[bytes]) -> bool:
    """Decompress `chunk` into `out`; on damage keep the output up to the first bad byte and return False."""
    backup = decomp.copy()
    try:
        out.append(decomp.decompress(chunk))
        return True
    except zlib.error:
        pass
    for i in range(len(chunk)):  # replay byte by byte to keep everything before the damage
        try:
            out.append(backup.decompress(chunk[i : i + 1]))
        except zlib.error:
            return False
    return False


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _decompress_tolerant(data: bytes) -> tuple[bytes, bool]:
    """The data of a file's gzip members up to any damage, and whether every member ended cleanly."""
    out: list[bytes] = []
    while data:
        decomp = zlib.decompressobj(_GZIP_WBITS)
        rest = b""
        for offset in range(0, len(data), _READ_CHUNK):
            if not _feed(decomp, data[offset : offset + _READ_CHUNK], out):
                return b"".join(out), False
            if decomp.eof:
                rest = decomp.unused_data + data[offset + _READ_CHUNK :]  # another member may follow
                break
        if not decomp.eof:
            return b"".join(out), False  # truncated: no trailer
        data = rest
    return b"".join(out), True


def read_segment(path: str) -> SegmentContent:
    """Read one segment or part file, keeping every good record before the first damage (Parquet: all rows).

    A part is a gzip JSON Lines journal or a binary one (journal.py), told apart by its first bytes.
    """
    if path.endswith(PARQUET):
        from .columnar import read_parquet_records

        return SegmentContent(read_parquet_records(path), True, 0)
    raw = _read(path)
    if is_journal(raw):
        from .columnar import journal_records

        journal = read_journal(raw)
        return SegmentContent(journal_records(journal), journal.complete, journal.good_bytes)
    return _read_lines(raw)


def _read_lines(raw: bytes) -> SegmentContent:
    """The good records of a gzip JSON Lines file's bytes."""
    data, stream_ok = _decompress_tolerant(raw)
    records: list[dict[str, Any]] = []
    good = 0
    complete = stream_ok
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            complete = complete and start == len(data)
            break
        try:
            record = json.loads(data[start:end])
        except ValueError:
            complete = False
            break
        if not isinstance(record, dict):
            complete = False
            break
        records.append(record)
        start = good = end + 1
    return SegmentContent(records, complete, good)


def read_segments(directory: str, *, include_open: bool = True, fill_nulls: bool = True) -> list[dict[str, Any]]:
    """Every record in `directory`'s segments, segment by segment in age order, each in written order.

    Reads `.jsonl.gz` and `.parquet` segments alike. Open `.part` files are read tolerantly (their good records)
    unless include_open is False; absent nullable fields are filled in as None unless fill_nulls is False.
    """
    names = [n for n in os.listdir(directory) if parse_name(n) is not None]
    finals = {n for n in names if n.endswith(CLOSED_SUFFIXES)}

    def closed_already(part: str) -> bool:
        final = part[: -len(".part")]
        return final in finals or final[: -len(SUFFIX)] + PARQUET in finals

    chosen = [n for n in names if n in finals or (include_open and not closed_already(n))]
    chosen.sort(key=lambda n: (parse_name(n).seq, n))  # type: ignore[union-attr]
    out: list[dict[str, Any]] = []
    for name in chosen:
        for record in read_segment(os.path.join(directory, name)).records:
            out.append(normalized(record) if fill_nulls else record)
    return out


@dataclass(slots=True)
class Recovery:
    """What recovering one `.part` file did."""

    part: str
    final: str | None  # closed segment written, None when nothing was recoverable
    records: int
    dropped_bytes: int  # uncompressed bytes after the last good line


def encode_lines(lines: list[bytes], level: int) -> bytes:
    """One gzip member holding `lines` (each already ending in a newline)."""
    comp = zlib.compressobj(level, zlib.DEFLATED, _GZIP_WBITS)
    return comp.compress(b"".join(lines)) + comp.flush(zlib.Z_FINISH)


def recover_part(directory: str, part_name: str, level: int = 6, fmt: str = "jsonl.gz") -> Recovery:
    """Turn a `.part` left by a crash into a closed segment holding its good records (or delete it if none).

    A closed segment of either format under the same name means the crash came after its rename: the journal goes.
    A half-written Parquet `.tmp` is deleted and the segment rebuilt from the journal.
    """
    part_path = os.path.join(directory, part_name)
    jsonl_name = part_name[: -len(".part")]
    parquet_name = jsonl_name[: -len(SUFFIX)] + PARQUET
    for done in (jsonl_name, parquet_name):  # crashed after the rename, before the unlink: the final file is durable
        if os.path.exists(os.path.join(directory, done)):
            os.unlink(part_path)
            fsync_dir(directory)
            return Recovery(part_name, done, segment_events(os.path.join(directory, done)), 0)
    try:
        os.unlink(os.path.join(directory, parquet_name + ".tmp"))
    except FileNotFoundError:
        pass
    final_name = parquet_name if fmt == "parquet" else jsonl_name
    final_path = os.path.join(directory, final_name)
    raw = _read(part_path)
    journal = read_journal(raw) if is_journal(raw) else None
    if journal is not None:
        count, dropped = journal.events, len(raw) - journal.good_bytes
    else:
        data, _ = _decompress_tolerant(raw)
        content = _read_lines(raw)
        count, dropped = len(content.records), len(data) - content.good_bytes
    if not count:
        os.unlink(part_path)
        fsync_dir(directory)
        return Recovery(part_name, None, 0, dropped)
    if fmt == "parquet":
        from .columnar import journal_to_parquet, records_to_parquet

        if journal is not None:
            journal_to_parquet(journal, final_path)
        else:
            records_to_parquet(content.records, final_path)
    else:
        if journal is not None:
            from .columnar import journal_records

            records = journal_records(journal)
        else:
            records = content.records
        lines = [json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records]
        atomic_write_as(final_path, encode_lines(lines, level))
    os.unlink(part_path)
    fsync_dir(directory)
    return Recovery(part_name, final_name, count, dropped)


def atomic_write_as(path: str, data: bytes) -> None:
    """Write `data` to a temporary file, fsync it, and rename it to `path` (a new name, never half-written)."""
    tmp = path + ".recover"
    write_synced(tmp, data)
    os.rename(tmp, path)


def segment_events(path: str) -> int:
    """How many records a closed segment holds (Parquet: from its footer)."""
    if path.endswith(PARQUET):
        from .columnar import parquet_rows

        return parquet_rows(path)
    return len(read_segment(path).records)


def eviction_reasons(path: str) -> list[str]:
    """The reasons of the log_evicted records in a closed segment."""
    if path.endswith(PARQUET):
        from .columnar import parquet_eviction_reasons

        return parquet_eviction_reasons(path)
    records = read_segment(path).records
    return [str(r.get("reason")) for r in records if r.get("kind") == "log_evicted" and r.get("reason")]
