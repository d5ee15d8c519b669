"""Clock transforms: one wall-clock offset per boot, so every event gets a comparable time `ts_us`."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cloud_spark.stamps import PLACE_KEY, event_place

BOOT_KEY = ("fleet", "node", "boot_id")
STEP_THRESHOLD_US = 1_000_000


def place_clocks(events: DataFrame) -> DataFrame:
    """Per place (boot, device, firmware): the partial clock aggregates boot_clocks combines (one hash pass).

    Also `client_log`: whether the place's events are a client's receipt log (what fate.logged_clients needs).
    """
    offset = F.col("ts_wall_us") - F.col("ts_mono_us")
    synced, mono = F.col("clock_synced"), F.col("ts_mono_us")
    return events.groupBy(*PLACE_KEY).agg(
        F.count(F.lit(1)).alias("events"),
        F.sum(F.when(~synced, 1).otherwise(0)).alias("unsynced_events"),
        F.min_by(F.when(synced, offset), F.when(synced, mono)).alias("synced_offset"),
        F.min(F.when(synced, mono)).alias("synced_mono_us"),
        F.max_by(offset, mono).alias("last_offset"),
        F.max(offset).alias("max_offset"), F.min(offset).alias("min_offset"),
        F.min(mono).alias("first_mono_us"), F.max(mono).alias("last_mono_us"),
        F.max(F.col("source") == "client").alias("client_log"),
    )


def boot_clocks(events: DataFrame, step_threshold_us: int = STEP_THRESHOLD_US) -> DataFrame:
    """Per boot: the wall-minus-monotonic offset to trust, whether it ever synced, and whether the wall clock stepped.

    The offset is the one seen at the boot's first NTP-synced event; a boot that never synced keeps the offset of its
    last event and is flagged. `offset_span_us` (max - min offset) above the threshold means the wall clock jumped.
    `events` may be the events or place_clocks' rows.
    """
    parts = events if "synced_mono_us" in events.columns else place_clocks(events)
    boots = parts.groupBy(*BOOT_KEY).agg(
        F.sum("events").alias("events"),
        F.sum("unsynced_events").alias("unsynced_events"),
        F.min_by("synced_offset", "synced_mono_us").alias("synced_offset"),
        F.max_by("last_offset", "last_mono_us").alias("last_offset"),
        (F.max("max_offset") - F.min("min_offset")).alias("offset_span_us"),
        F.min("first_mono_us").alias("first_mono_us"), F.max("last_mono_us").alias("last_mono_us"),
    )
    return boots.select(
        *BOOT_KEY, "events", "unsynced_events",
        F.coalesce("synced_offset", "last_offset").alias("offset_us"),
        F.col("synced_offset").isNotNull().alias("boot_synced"),
        "offset_span_us",
        (F.col("offset_span_us") > step_threshold_us).alias("clock_stepped"),
        (F.col("first_mono_us") + F.coalesce("synced_offset", "last_offset")).alias("first_us"),
        (F.col("last_mono_us") + F.coalesce("synced_offset", "last_offset")).alias("last_us"),
    )


def with_event_time(events: DataFrame, place_rows: DataFrame) -> DataFrame:
    """Add `place`, `ts_us` (monotonic time moved onto the boot's trusted wall clock) and `boot_synced`."""
    small = place_rows.select("place", "offset_us", "boot_synced")
    return (events.withColumn("place", event_place()).join(F.broadcast(small), "place", "left")
            .withColumn("ts_us", F.col("ts_mono_us") + F.col("offset_us"))
            .drop("offset_us"))
