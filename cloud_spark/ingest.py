"""Ingest transforms: raw JSON lines -> typed, validated records; rejects to quarantine with a reason; dedupe."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cloud_spark.schema import SOURCES, VERSIONS, VersionSpec, canonical_schema, parse_schema

ROW = "_row"  # a record's position in its file: with `file`, which copy of a repeated event_id is kept
RAW_COLUMNS = ("value", "file", ROW, "path_fleet", "path_date", "path_device")
QUARANTINE_COLUMNS = ("reason", "schema_version", "event_id", "value", "file", "path_fleet", "path_date", "path_device")

# Fields a record of a given kind cannot do without (beyond the version's always-required fields).
KIND_REQUIRES: dict[str, tuple[str, ...]] = {
    "routed": ("msg_id", "subscriber"), "queued_offline": ("msg_id", "subscriber"),
    "delivered": ("msg_id", "subscriber"), "acked": ("msg_id", "subscriber"),
    "forwarded": ("msg_id", "peer_node"), "forward_acked": ("msg_id", "peer_node"),
    "received": ("msg_id",), "committed": ("msg_id",),
    "peer_up": ("peer_node",), "peer_down": ("peer_node",),
    "client_published": ("publisher",), "client_acked": ("publisher",), "client_received": ("publisher",),
}
CORRUPT = "_corrupt_record"
REJECT = "_reject_reason"
QUARANTINE_SCHEMA = "reason string, schema_version int, event_id string, value string, file string, " \
    "path_device string, path_fleet string, path_date string"


def parse_json_lines(raw: DataFrame, versions: Mapping[int, VersionSpec] = VERSIONS) -> DataFrame:
    """Parse each line once against the union of all versions' fields; keep the raw line and where it came from."""
    schema = parse_schema(versions).add(CORRUPT, "string")
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    parsed = raw.select(*RAW_COLUMNS, F.from_json("value", schema, opts).alias("r"))
    return parsed.select(*RAW_COLUMNS, "r.*")


def typed_records(typed: DataFrame, versions: Mapping[int, VersionSpec] = VERSIONS) -> DataFrame:
    """Bring already-typed records (Parquet segments) to parse_json_lines' shape; `value` is left null (see checks)."""
    schema = parse_schema(versions)
    cols = [(F.col(f.name) if f.name in typed.columns else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields]
    out = typed.select(*[F.col(c) for c in RAW_COLUMNS if c != "value" and c in typed.columns], *cols)
    for c in RAW_COLUMNS:
        if c not in out.columns:
            out = out.withColumn(c, F.lit(None).cast("long" if c == ROW else "string"))
    return out.withColumn(CORRUPT, F.lit(None).cast("string")).select(*RAW_COLUMNS, *schema.fieldNames(), CORRUPT)


def _first_reason(checks: list[tuple[Column, Column | str]]) -> Column:
    expr: Column | None = None
    for cond, reason in reversed(checks):
        r = reason if isinstance(reason, Column) else F.lit(reason)
        expr = F.when(cond, r) if expr is None else F.when(cond, r).otherwise(expr)
    assert expr is not None
    return expr


def _version_checks(spec: VersionSpec) -> Column:
    """The first thing wrong with a record of this version, or null."""
    checks: list[tuple[Column, Column | str]] = []
    for name in spec.required:
        checks.append((F.col(name).isNull(), f"missing required field: {name}"))
    checks.append((~F.col("kind").isin(*spec.kinds), F.concat(F.lit("unknown kind: "), F.col("kind"))))
    checks.append((~F.col("source").isin(*SOURCES), F.concat(F.lit("unknown source: "), F.col("source"))))
    for kind, needs in KIND_REQUIRES.items():
        for name in needs:
            if name in spec.schema.fieldNames():
                checks.append(((F.col("kind") == kind) & F.col(name).isNull(), f"{kind} without {name}"))
    checks.append((F.col("path_fleet").isNotNull() & (F.col("path_fleet") != F.col("fleet")),
                   "fleet differs from upload path"))
    checks.append((F.col("path_device").isNotNull() & (F.col("path_device") != F.col("device")),
                   "device differs from upload path"))
    return _first_reason(checks)


def _known_version_checks(versions: Mapping[int, VersionSpec]) -> Column:
    """The first rule a parsed record breaks once it has a known schema_version, or null."""
    per_version = F.lit(None).cast("string")
    for v, spec in versions.items():
        per_version = F.when(F.col("schema_version") == v, _version_checks(spec)).otherwise(per_version)
    return per_version


def _version_reason() -> list[tuple[Column, Column | str]]:
    return [(F.col("schema_version").isNull(), "missing required field: schema_version")]


def with_reject_reason(parsed: DataFrame, versions: Mapping[int, VersionSpec] = VERSIONS) -> DataFrame:
    """Add `reject_reason`: null for a good record, else the first rule it breaks."""
    schema = parse_schema(versions)
    bad_type = F.coalesce(*[
        F.when(F.get_json_object("value", f"$.{f.name}").isNotNull() & F.col(f.name).isNull(),
               F.lit(f"bad type for field: {f.name}"))
        for f in schema.fields
    ], F.lit("not a JSON object"))
    known = F.col("schema_version").isin(*versions.keys())
    reason = _first_reason([
        (F.trim(F.col("value")) == "", "empty record"),
        (F.col(CORRUPT).isNotNull() & F.get_json_object("value", "$").isNull(), "malformed JSON"),
        (~F.ltrim(F.col("value")).startswith("{"), "not a JSON object"),
        (F.col(CORRUPT).isNotNull() & F.col("schema_version").isNull()
         & F.get_json_object("value", "$.schema_version").isNotNull(), "bad type for field: schema_version"),
        *_version_reason(),
        (~known, F.concat(F.lit("unknown schema_version: "), F.col("schema_version").cast("string"))),
        (F.col(CORRUPT).isNotNull(), bad_type),
    ])
    return parsed.withColumn(REJECT, F.coalesce(reason, _known_version_checks(versions)))


def with_typed_reject_reason(records: DataFrame, versions: Mapping[int, VersionSpec] = VERSIONS) -> DataFrame:
    """with_reject_reason for typed_records (no text to parse); a rejected record's `value` becomes its JSON."""
    known = F.col("schema_version").isin(*versions.keys())
    reason = F.coalesce(_first_reason([
        *_version_reason(),
        (~known, F.concat(F.lit("unknown schema_version: "), F.col("schema_version").cast("string"))),
    ]), _known_version_checks(versions))
    fields = parse_schema(versions).fieldNames()
    as_json = F.to_json(F.struct(*[F.col(c) for c in fields]))  # only evaluated for the rejected rows
    return (records.withColumn(REJECT, reason)
            .withColumn("value", F.when(F.col(REJECT).isNotNull(), as_json)))


def quarantine(checked: DataFrame) -> DataFrame:
    """The rejected records, raw line kept, with the reason and where they came from."""
    bad = checked.where(F.col(REJECT).isNotNull()).withColumn("reason", F.col(REJECT))
    return bad.select(*QUARANTINE_COLUMNS)


def accepted(checked: DataFrame, versions: Mapping[int, VersionSpec] = VERSIONS,
             keep: tuple[str, ...] = ()) -> DataFrame:
    """The good records in the canonical shape, plus the `date` partition (upload path's, else the wall clock's).

    `keep` names raw columns to carry along (dedupe uses `file` and `_row`).
    """
    good = checked.where(F.col(REJECT).isNull())
    for spec in versions.values():
        for old, new in spec.renames.items():
            good = good.withColumn(new, F.when(F.col("schema_version") == spec.version, F.col(old))
                                   .otherwise(F.col(new)))
    canon = canonical_schema(versions)
    wall_date = F.date_format(F.timestamp_micros("ts_wall_us"), "yyyy-MM-dd")
    return good.select(*[F.col(f.name).cast(f.dataType) for f in canon.fields],
                       F.coalesce(F.col("path_date"), wall_date).alias("date"), *keep)


def suspects(checked: DataFrame) -> DataFrame:
    """Per 64-bit hash of event_id seen more than once: how many records carry it (rejected ones included).

    One hash aggregation over one fixed-width key, reading only the event_id column; the result is small. A hash
    shared by two different ids, or a copy that was rejected, only makes an id a candidate: repeated_ids recounts
    the candidates among the accepted records by their exact id.
    """
    return (checked.groupBy(F.xxhash64("event_id").alias("h"))
            .agg(F.count(F.lit(1)).alias("copies"))
            .where(F.col("copies") > 1))


def repeated_ids(good: DataFrame, suspect_rows: DataFrame) -> DataFrame:
    """The accepted event ids seen more than once: copies, and which copy (file, _row) to keep (the smallest)."""
    candidates = suspect_rows.where(F.col("copies") > 1).select("h")
    rows = good.join(F.broadcast(candidates), F.xxhash64("event_id") == F.col("h"), "left_semi")
    return (rows.groupBy("event_id")
            .agg(F.count(F.lit(1)).alias("copies"), F.min(F.struct("file", ROW)).alias("keep"))
            .where(F.col("copies") > 1))


def dedupe(good: DataFrame, repeated: DataFrame | None) -> DataFrame:
    """One row per event_id (re-uploads repeat records); `copies` says how many times it was seen.

    good: accepted(..., keep=("file", "_row")); repeated: repeated_ids (small, broadcast), None when nothing repeats.
    Every record passes through in one scan; of a repeated id only the chosen copy stays, so nothing is shuffled.
    """
    cols = [c for c in good.columns if c not in ("file", ROW)]
    if repeated is None:
        return good.select(*cols, F.lit(1).cast("long").alias("copies"))
    j = good.join(F.broadcast(repeated), "event_id", "left")
    chosen = F.col("copies").isNull() | ((F.col("file") == F.col("keep.file")) & (F.col(ROW) == F.col(f"keep.{ROW}")))
    return j.where(chosen).select(*cols, F.coalesce(F.col("copies"), F.lit(1)).cast("long").alias("copies"))
