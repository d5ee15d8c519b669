"""Thin jobs: read -> pure transforms -> write. Each prints its steps; none collects event-sized data."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import DataFrame, DataFrameWriter, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cloud_spark import clock, fate, ingest, latency, ordering, rollups, stamps
from cloud_spark.schema import VERSIONS, VersionSpec, canonical_schema, parse_schema
from cloud_spark.summary import build_summary

TIMED_COLUMNS = ("fleet", "node", "device", "boot_id", "source", "kind", "msg_id", "subscriber", "publisher",
                 "publisher_seq", "topic", "qos", "dup", "reason", "peer_node", "ts_us", "place")
PATH_COLUMNS = {"fleet": "path_fleet", "date": "path_date", "device": "path_device"}
_STAMP_TIMES = tuple(f"{s}_at.{t}" for s in ("received", "committed", "routed", "delivered", "acked")
                     for t in ("ts_us", "ts_mono_us"))
# Nearly unique columns of the event-sized tables: Parquet would build a dictionary for each and then give it up.
PLAIN_COLUMNS: dict[str, tuple[str, ...]] = {
    "events": ("event_id", "msg_id", "ts_wall_us", "ts_mono_us"),
    "fate": ("msg_id", "routed_us", "first_delivered_us", "received_us", "acked_us", *_STAMP_TIMES),
    "latency": ("msg_id", "latency_us"),
}


@contextmanager
def step(name: str, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """Print a step's start and its wall time (the progress display next to Spark's stage bars)."""
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    t0 = time.monotonic()
    say(f"[cloud_spark] {name} ...")
    yield
    say(f"[cloud_spark] {name} done in {time.monotonic() - t0:.1f}s")


def _with_path_columns(df: DataFrame, fleets: Sequence[str] | None, dates: Sequence[str] | None,
                       keep: bool = False) -> DataFrame:
    if fleets and "fleet" in df.columns:
        df = df.where(F.col("fleet").isin(*fleets))
    if dates and "date" in df.columns:
        df = df.where(F.col("date").isin(*dates))
    for part, col in PATH_COLUMNS.items():
        if part not in df.columns:
            df = df.withColumn(col, F.lit(None).cast("string"))
        else:
            df = df.withColumn(col, F.col(part)) if keep else df.withColumnRenamed(part, col)
    return df


def read_json_segments(spark: SparkSession, root: str, fleets: Sequence[str] | None = None,
                       dates: Sequence[str] | None = None, glob: str = "*.jsonl.gz") -> DataFrame:
    """Raw lines of every JSON Lines segment under root (Hive keys fleet=/date=/device= become path_* columns)."""
    raw = spark.read.option("pathGlobFilter", glob).option("basePath", root).text(root)
    raw = raw.withColumn("file", F.input_file_name()).withColumn(ingest.ROW, F.monotonically_increasing_id())
    return _with_path_columns(raw, fleets, dates).select(*ingest.RAW_COLUMNS)


def read_parquet_segments(spark: SparkSession, root: str, versions: Mapping[int, VersionSpec],
                          fleets: Sequence[str] | None = None, dates: Sequence[str] | None = None) -> DataFrame:
    """Parquet segments under root, read with every version's fields (absent ones null), Hive keys as path_*."""
    df = (spark.read.schema(parse_schema(versions)).option("pathGlobFilter", "*.parquet")
          .option("basePath", root).parquet(root))
    df = df.withColumn("file", F.input_file_name()).withColumn(ingest.ROW, F.col("_metadata.row_index"))
    return _with_path_columns(df, fleets, dates, keep=True)


def events_schema(versions: Mapping[int, VersionSpec] = VERSIONS) -> T.StructType:
    """The `events` table's columns (what ingest writes): the canonical record, its `date` and its `copies`."""
    return T.StructType([*canonical_schema(versions).fields, T.StructField("date", T.StringType()),
                         T.StructField("copies", T.LongType())])


def read_events(spark: SparkSession, out: str, versions: Mapping[int, VersionSpec] = VERSIONS) -> DataFrame:
    """OUT/events read with its explicit schema: a table no segment has written to yet reads as empty, not an error."""
    return spark.read.schema(events_schema(versions)).parquet(f"{out}/events")


def _has_files(root: str, suffix: str) -> bool:
    """Whether root holds any file ending in suffix (always assumed for object-store URLs: Spark lists those)."""
    return "://" in root or any(Path(root).rglob(f"*{suffix}"))


def ingest_job(spark: SparkSession, src: str, out: str, fleets: Sequence[str] | None = None,
               dates: Sequence[str] | None = None, versions: Mapping[int, VersionSpec] = VERSIONS,
               parquet: bool = True) -> dict[str, object]:
    """Segments -> events (validated, deduped; partitioned by fleet/date) + quarantine (with reason).

    Both segment formats are read side by side, told apart by extension: `*.parquet` (the default) and gzip JSON
    Lines `*.jsonl.gz`; `parquet=False` reads JSON Lines only.
    """
    with step("ingest: read, validate, dedupe, write events + quarantine"):
        parts: list[DataFrame] = []
        has_json = _has_files(src, ".jsonl.gz")
        has_parquet = parquet and _has_files(src, ".parquet")
        if not has_parquet and not has_json:
            print(f"[cloud_spark] ingest: no segment (*.parquet, *.jsonl.gz) under {src}: the tables stay empty",
                  file=sys.stderr, flush=True)
        if parquet and (has_parquet or not has_json):  # an empty upload gives empty tables
            typed = ingest.typed_records(read_parquet_segments(spark, src, versions, fleets, dates), versions)
            parts.append(ingest.with_typed_reject_reason(typed, versions))
        if has_json:
            parsed = ingest.parse_json_lines(read_json_segments(spark, src, fleets, dates), versions)
            checked = ingest.with_reject_reason(parsed, versions)
            # keep the raw line only where it is needed (rejects)
            parts.append(checked.withColumn("value", F.when(F.col(ingest.REJECT).isNotNull(), F.col("value"))))
        checked = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        if has_json:  # JSON is parsed once and kept (its row ids must stay put); Parquet is cheaper to re-read
            checked = checked.persist()
        try:
            ingest.suspects(checked).write.mode("overwrite").parquet(f"{out}/_staging/suspects")
            suspects = spark.read.parquet(f"{out}/_staging/suspects")
            good = ingest.accepted(checked, versions, keep=("file", ingest.ROW))
            repeated = None
            if suspects.limit(1).count():
                ingest.repeated_ids(good, suspects).write.mode("overwrite").parquet(f"{out}/_staging/repeated")
                repeated = spark.read.parquet(f"{out}/_staging/repeated")
            # the events pass counts the rejected records it skips, so the quarantine needs no pass of its own
            seen = Observation("ingest")
            kept = ingest.accepted(checked.observe(seen, F.count(ingest.REJECT).alias("rejected")), versions,
                                   keep=("file", ingest.ROW))
            overwrite(ingest.dedupe(kept, repeated), "events").partitionBy("fleet", "date").parquet(f"{out}/events")
            bad = (ingest.quarantine(checked) if seen.get["rejected"]
                   else spark.createDataFrame([], ingest.QUARANTINE_SCHEMA).select(*ingest.QUARANTINE_COLUMNS))
            bad.write.mode("overwrite").partitionBy("path_fleet", "path_date").parquet(f"{out}/quarantine")
        finally:
            if has_json:
                checked.unpersist()
    return ingest_stats(spark, out, versions)


def ingest_stats(spark: SparkSession, out: str, versions: Mapping[int, VersionSpec] = VERSIONS) -> dict[str, object]:
    """Counts over what ingest wrote: events kept, duplicate copies removed, rejects per reason."""
    ev = read_events(spark, out, versions).agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("copies") - 1).alias("d"))
    row = ev.first()
    q = spark.read.schema(ingest.QUARANTINE_SCHEMA).parquet(f"{out}/quarantine").groupBy("reason").count().collect()
    return {"events": int(row["n"] or 0) if row else 0, "duplicates_removed": int(row["d"] or 0) if row else 0,
            "quarantined": {r["reason"]: int(r["count"]) for r in q}}


def analyze_job(spark: SparkSession, out: str, window_end_us: int | None = None,
                grace_us: int = fate.DEFAULT_GRACE_US, ingest_summary: dict[str, object] | None = None,
                versions: Mapping[int, VersionSpec] = VERSIONS) -> dict:
    """events -> clocks, fate, ordering, latency, roll-ups, incidents (Parquet) and summary.json.

    Without any event every table is written empty (with its columns) and the summary counts zeros; its window end
    is null unless given.
    """
    events = read_events(spark, out, versions)
    with step("analyze: clocks"):
        per_place = clock.place_clocks(events).cache()  # one pass over the events; small
        try:
            clock.boot_clocks(per_place).write.mode("overwrite").parquet(f"{out}/clocks")
            clocks = spark.read.parquet(f"{out}/clocks")
            stamps.places(per_place, clocks).write.mode("overwrite").parquet(f"{out}/places")
        finally:
            per_place.unpersist()
    places = spark.read.parquet(f"{out}/places")
    if window_end_us is None:
        last = clocks.agg(F.max("last_us")).first()[0]  # type: ignore[index]
        window_end_us = None if last is None else int(last)  # None: not a single event
    end_us = 0 if window_end_us is None else window_end_us  # without events nothing is measured against it
    # each analysis pass reads only the columns it needs straight from Parquet: cheaper than building a cache
    timed = clock.with_event_time(events, places).select(*TIMED_COLUMNS)
    with step("analyze: message fate"):
        drops = fate.drops(timed).cache()  # one pass for the pairs' and the ingress drops; small
        try:
            facts = fate.fates(fate.pairs(timed, drops), fate.messages(timed), fate.receipts(timed),
                               fate.logged_clients(places), places, end_us, grace_us)
            overwrite(facts, "fate").partitionBy("fleet", "date").parquet(f"{out}/fate")
            fate.ingress_drops(drops).write.mode("overwrite").parquet(f"{out}/ingress_drops")
        finally:
            drops.unpersist()
    fates = spark.read.schema(facts.schema).parquet(f"{out}/fate")  # schema given: an empty table still reads
    with step("analyze: ordering"):
        arr = ordering.arrivals(fates)
        ordering.late_deliveries(arr).write.mode("overwrite").parquet(f"{out}/late")
        late = spark.read.parquet(f"{out}/late")
        ordering.streams(ordering.delivered(fates), late).write.mode("overwrite").parquet(f"{out}/streams")
    with step("analyze: latency"):
        lat = latency.hop_latencies(fates, latency.forwards(timed, places), places)
        overwrite(lat, "latency").partitionBy("fleet", "hop").parquet(f"{out}/latency")
        lat = spark.read.schema(lat.schema).parquet(f"{out}/latency")
        latency.latency_summary(lat).write.mode("overwrite").parquet(f"{out}/latency_summary")
        latency.latency_histogram(lat).write.mode("overwrite").parquet(f"{out}/latency_hist")
    with step("analyze: roll-ups and incidents"):
        sets = rollups.rollup_sets(fates, late).cache()  # one pass over the fates for every dimension; small
        try:
            for dim in rollups.DIMENSIONS:
                rollups.rollup_of(sets, dim).write.mode("overwrite").parquet(f"{out}/rollup_{dim}")
        finally:
            sets.unpersist()
        life = rollups.lifecycle(timed).cache()  # windows and crash evidence from one pass; small
        try:
            inc = rollups.incidents(life, timed, end_us)
            rollups.incident_impact(inc, fates, late).write.mode("overwrite").parquet(f"{out}/incidents")
        finally:
            life.unpersist()
    with step("analyze: summary"):
        summary = build_summary(spark, out, window_end_us, grace_us, ingest_summary)
        write_text(spark, f"{out}/summary.json", json.dumps(summary, indent=2, sort_keys=True))
    return summary


def overwrite(df: DataFrame, table: str) -> DataFrameWriter:
    """df's writer in overwrite mode, without dictionary encoding for the table's nearly unique columns."""
    w = df.write.mode("overwrite")
    for c in PLAIN_COLUMNS.get(table, ()):
        w = w.option(f"parquet.enable.dictionary#{c}", "false")
    return w


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Write one small text file through Hadoop's FileSystem, so object-store outputs work like local ones."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()
