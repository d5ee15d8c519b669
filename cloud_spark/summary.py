"""The summary: a small JSON document built only from the already-aggregated tables."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cloud_spark.fate import FATES


def _int(v: Any) -> int:
    return int(v or 0)


def build_summary(spark: SparkSession, out: str, window_end_us: int | None, grace_us: int,
                  ingest_summary: dict[str, object] | None = None) -> dict[str, Any]:
    """Totals over all fleets and per fleet: fates, duplicates, ordering, latency, clocks, incidents, ingest."""
    read = spark.read.parquet
    fleets = read(f"{out}/rollup_fleet")
    totals = fleets.agg(*[F.sum(c).alias(c) for c in ("pairs", *FATES, "duplicated", "e2e_lost", "late",
                                                      "inversions")]).first()
    assert totals is not None
    fate_rows = spark.read.schema("e2e_fate string").parquet(f"{out}/fate")  # still reads with no partition yet
    e2e = {r["e2e_fate"]: _int(r["count"]) for r in
           fate_rows.where(F.col("e2e_fate").isNotNull()).groupBy("e2e_fate").count().collect()}
    streams = read(f"{out}/streams").agg(F.count(F.lit(1)).alias("streams"),
                                         F.sum(F.when(F.col("late") > 0, 1).otherwise(0)).alias("reordered"),
                                         F.max("max_displacement").alias("max_displacement")).first()
    assert streams is not None
    lat = {r["hop"]: {k: (None if r[k] is None else int(r[k])) for k in
                      ("measured", "untrusted_clock", "p50_us", "p95_us", "p99_us", "max_us")}
           for r in read(f"{out}/latency_summary").where(F.col("fleet") == "*").collect()}
    clocks = read(f"{out}/clocks").agg(
        F.count(F.lit(1)).alias("boots"), F.sum(F.col("clock_stepped").cast("int")).alias("stepped"),
        F.sum((~F.col("boot_synced")).cast("int")).alias("never_synced"),
        F.sum("unsynced_events").alias("unsynced_events")).first()
    assert clocks is not None
    incidents = {r["incident"]: {"count": _int(r["n"]), "lost": _int(r["lost"]), "late": _int(r["late"])}
                 for r in read(f"{out}/incidents").groupBy("incident").agg(
                     F.count(F.lit(1)).alias("n"), F.sum("lost").alias("lost"), F.sum("late").alias("late")).collect()}
    drops = {r["reason"]: _int(r["m"]) for r in
             read(f"{out}/ingress_drops").groupBy("reason").agg(F.sum("messages").alias("m")).collect()}
    per_fleet = {r["fleet"]: {c: _int(r[c]) for c in ("pairs", *FATES, "duplicated", "late", "inversions")}
                 for r in fleets.collect()}
    return {
        "window_end_us": window_end_us, "grace_us": grace_us,
        "pairs": _int(totals["pairs"]),
        "fates": {f: _int(totals[f]) for f in FATES},
        "duplicated": _int(totals["duplicated"]),
        "e2e": e2e,
        "ordering": {"late": _int(totals["late"]), "inversions": _int(totals["inversions"]),
                     "streams": _int(streams["streams"]), "reordered_streams": _int(streams["reordered"]),
                     "max_displacement": _int(streams["max_displacement"])},
        "latency": lat,
        "clocks": {"boots": _int(clocks["boots"]), "stepped": _int(clocks["stepped"]),
                   "never_synced": _int(clocks["never_synced"]), "unsynced_events": _int(clocks["unsynced_events"])},
        "incidents": incidents,
        "ingress_drops": drops,
        "fleets": per_fleet,
        "ingest": ingest_summary or {},
    }
