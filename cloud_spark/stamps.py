"""Stamps (where and when an event happened) kept as two longs while aggregating, rebuilt as structs afterwards.

Spark can hash-aggregate only fixed-width buffers: `min_by(struct(node, ..., ts), ts)` falls back to sorting every
event. So an aggregation keeps a *place* id (xxhash64 of fleet, node, boot, device, firmware) and the event time
`ts_us`; `attach` turns the pair back into the stamp struct through a broadcast join with the small `places` table.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

PLACE_KEY = ("fleet", "node", "boot_id", "device", "firmware")
STAMP_FIELDS = ("node", "device", "firmware", "boot_id", "ts_mono_us", "ts_us", "boot_synced")


def place_of(fleet: Column | str, node: Column | str, boot_id: Column | str, device: Column | str,
             firmware: Column | str) -> Column:
    """The place id of an event (or stamp): a 64-bit hash of where it happened."""
    return F.xxhash64(fleet, node, boot_id, device, firmware)


def event_place() -> Column:
    """place_of an event row's own columns."""
    return place_of(*PLACE_KEY)


def stamp_place(fleet: Column | str, stamp: Column) -> Column:
    """place_of a stamp struct (null for a null stamp)."""
    return F.when(stamp.isNotNull(), place_of(fleet, stamp.node, stamp.boot_id, stamp.device, stamp.firmware))


def first(cond: Column, ts: str = "ts_us", place: str = "place") -> tuple[Column, Column]:
    """(place, time) of the earliest row matching cond: two hash-aggregatable expressions."""
    when_ts = F.when(cond, F.col(ts))
    return F.min_by(F.when(cond, F.col(place)), when_ts), F.min(when_ts)


def last(ts: str = "ts_us", place: str = "place") -> tuple[Column, Column]:
    """(place, time) of the latest row."""
    return F.max_by(F.col(place), F.col(ts)), F.max(F.col(ts))


def places(events: DataFrame, clocks: DataFrame) -> DataFrame:
    """One row per place: its id, where it is, its boot's clock offset and sync state, whether a client logged there.

    events: the events or clock.place_clocks' rows (a small table).
    """
    client = F.col("client_log") if "client_log" in events.columns else F.col("source") == "client"
    where = events.groupBy(*PLACE_KEY).agg(F.max(client).alias("client_log"))
    boot = clocks.select("fleet", "node", "boot_id", "offset_us", "boot_synced")
    return (where.join(F.broadcast(boot), ["fleet", "node", "boot_id"], "left")
            .select(event_place().alias("place"), *PLACE_KEY, "offset_us", "boot_synced", "client_log"))


def attach(rows: DataFrame, name: str, place_rows: DataFrame, fields: tuple[str, ...] = STAMP_FIELDS) -> DataFrame:
    """Replace columns `{name}_place` and `{name}_ts` by the stamp struct `name` (null when the time is null)."""
    p = place_rows.select(*[F.col(c).alias(f"_{name}_{c}") for c in
                            ("place", "node", "device", "firmware", "boot_id", "offset_us", "boot_synced")])
    ts = F.col(f"{name}_ts")
    value = {"node": F.col(f"_{name}_node"), "device": F.col(f"_{name}_device"),
             "firmware": F.col(f"_{name}_firmware"), "boot_id": F.col(f"_{name}_boot_id"),
             "ts_mono_us": ts - F.col(f"_{name}_offset_us"), "ts_us": ts,
             "boot_synced": F.col(f"_{name}_boot_synced")}
    stamp = F.when(ts.isNotNull(), F.struct(*[value[f].alias(f) for f in fields]))
    joined = rows.join(F.broadcast(p), F.col(f"{name}_place") == F.col(f"_{name}_place"), "left")
    cols = [stamp.alias(name) if c == f"{name}_place" else F.col(c) for c in rows.columns if c != f"{name}_ts"]
    return joined.select(*cols)
