"""The delivery-log writer's limits, counters and error (shared by the writer, its child process and the sink)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .segments import FORMATS


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
    level: int = 6  # gzip level of jsonl.gz segments (and of a Parquet segment that falls back to jsonl.gz)
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
