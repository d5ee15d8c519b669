"""Fate transforms: what became of each message for each intended subscriber, broker-side and end to end."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cloud_spark import stamps

FATES = ("acked", "delivered", "delivered_not_acked", "dropped", "expired", "lost", "pending")
PAIR_KINDS = ("routed", "queued_offline", "delivered", "acked", "expired", "dropped")
DEFAULT_GRACE_US = 60_000_000


def _count(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0))


def messages(timed: DataFrame) -> DataFrame:
    """One row per message: ingress stamps (received, committed) as place and time, and the publisher's identity."""
    kind = F.col("kind")
    broker = timed.where((F.col("source") == "broker") & F.col("msg_id").isNotNull())
    ingress = broker.where(kind.isin("received", "committed") & F.col("subscriber").isNull())
    firsts = [c.alias(f"{k}_{part}") for k in ("received", "committed")
              for c, part in zip(stamps.first(kind == k), ("place", "ts"), strict=True)]
    return ingress.groupBy("fleet", "msg_id").agg(
        *firsts,
        F.max(F.when(kind == "received", F.col("publisher"))).alias("publisher"),
        F.max(F.when(kind == "received", F.col("publisher_seq"))).alias("publisher_seq"),
        F.max(F.when(kind == "received", F.col("topic"))).alias("topic"),
        F.max(F.when(kind == "received", F.col("qos"))).alias("msg_qos"),
    )


def drops(timed: DataFrame) -> DataFrame:
    """Per (message, subscriber) a broker dropped: the last drop's reason (subscriber null: at ingress; small)."""
    dropped = timed.where((F.col("source") == "broker") & F.col("msg_id").isNotNull() & (F.col("kind") == "dropped"))
    return dropped.groupBy("fleet", "msg_id", "subscriber").agg(
        F.max_by(F.col("reason"), F.col("ts_us")).alias("reason"))


def pairs(timed: DataFrame, drop_rows: DataFrame) -> DataFrame:
    """One row per (message, intended subscriber) seen in any per-subscriber broker event.

    One hash aggregation over the per-subscriber events (stamps as place and time, see stamps.py; fates attaches
    them); the drop reason, the one string, comes from drop_rows (drops()).
    """
    kind = F.col("kind")
    per_sub = timed.where((F.col("source") == "broker") & F.col("msg_id").isNotNull()
                          & F.col("subscriber").isNotNull() & kind.isin(*PAIR_KINDS))
    key = ["fleet", "msg_id", "subscriber"]
    firsts = [c.alias(f"{k}_{part}") for k in ("routed", "delivered", "acked")
              for c, part in zip(stamps.first(kind == k), ("place", "ts"), strict=True)]
    seen_place, seen_ts = stamps.last()
    agg = per_sub.groupBy(*key).agg(
        *firsts,
        F.max(F.when(kind.isin("routed", "delivered"), F.col("qos"))).alias("pair_qos"),
        _count(kind == "delivered").alias("deliveries"),
        _count((kind == "delivered") & F.coalesce(F.col("dup"), F.lit(False))).alias("dup_flag_deliveries"),
        _count(kind == "queued_offline").alias("queued"),
        _count(kind == "expired").alias("expired"),
        seen_ts.alias("last_us"), seen_place.alias("last_seen_place"),
    ).withColumn("last_seen_ts", F.col("last_us"))
    dropped = drop_rows.where(F.col("subscriber").isNotNull()).select(
        *key, F.coalesce(F.col("reason"), F.lit("unspecified")).alias("drop_reason"))
    return agg.join(dropped, key, "left")


def receipts(timed: DataFrame) -> DataFrame:
    """Client-side receipts per (publisher, publisher_seq, receiving client)."""
    got = timed.where((F.col("source") == "client") & (F.col("kind") == "client_received")
                      & F.col("publisher_seq").isNotNull())
    return (got.withColumn("receiver", F.coalesce("subscriber", "node"))
            .groupBy("fleet", "publisher", "publisher_seq", "receiver")
            .agg(F.count(F.lit(1)).alias("e2e_receipts"), F.min("ts_us").alias("e2e_first_us")))


def logged_clients(place_rows: DataFrame) -> DataFrame:
    """The clients that uploaded any receipt log: only for them can end-to-end loss be judged (from the places)."""
    return place_rows.where(F.col("client_log")).select("fleet", F.col("node").alias("receiver")).distinct()


def fates(pair_rows: DataFrame, message_rows: DataFrame, receipt_rows: DataFrame, clients: DataFrame,
          place_rows: DataFrame, window_end_us: int, grace_us: int = DEFAULT_GRACE_US) -> DataFrame:
    """Classify every (message, subscriber); `pending` when the outcome could still change after the window end.

    The joins shuffle the narrow rows (stamps as place and time); the stamps are attached after them.
    """
    rec = receipt_rows.withColumnRenamed("receiver", "subscriber")
    cl = clients.withColumnRenamed("receiver", "subscriber").withColumn("client_logged", F.lit(True))
    j = (pair_rows.join(message_rows, ["fleet", "msg_id"], "left")
         .join(rec, ["fleet", "publisher", "publisher_seq", "subscriber"], "left")
         .join(F.broadcast(cl), ["fleet", "subscriber"], "left"))
    for name in ("routed", "delivered", "acked", "received", "committed"):
        j = stamps.attach(j, name, place_rows)
    j = stamps.attach(j, "last_seen", place_rows, ("node", "device", "firmware"))
    where = F.coalesce(F.col("routed"), F.col("delivered"))
    qos = F.coalesce("pair_qos", "msg_qos")
    recent = F.col("last_us") > F.lit(window_end_us - grace_us)
    delivered = F.col("deliveries") > 0
    fate = (F.when(F.col("acked").isNotNull(), "acked")
            .when(delivered & (qos == 0), "delivered")
            .when(F.col("drop_reason").isNotNull(), "dropped")
            .when(F.col("expired") > 0, "expired")
            .when(delivered & recent, "pending")
            .when(delivered, "delivered_not_acked")
            .when(F.col("queued") > 0, "pending")
            .when(recent, "pending")
            .otherwise("lost"))
    reason = (F.when(fate == "dropped", F.col("drop_reason"))
              .when((fate == "pending") & delivered, "awaiting_ack")
              .when((fate == "pending") & (F.col("queued") > 0), "queued_offline")
              .when(fate == "pending", "in_flight"))
    base = (
        "fleet", "msg_id", "subscriber", "publisher", "publisher_seq", "topic", qos.alias("qos"),
        F.coalesce(where.node, F.col("last_seen.node")).alias("node"),
        F.coalesce(where.device, F.col("last_seen.device")).alias("device"),
        F.coalesce(where.firmware, F.col("last_seen.firmware")).alias("firmware"),
        F.coalesce(where.ts_us, F.col("last_us")).alias("routed_us"),
        F.col("committed").isNotNull().alias("committed"),
        F.col("deliveries").cast("int").alias("deliveries"),
        (F.col("deliveries") > 1).alias("duplicated"),
        F.col("dup_flag_deliveries").cast("int").alias("dup_flag_deliveries"),
        F.col("delivered.ts_us").alias("first_delivered_us"),
        F.col("delivered.node").alias("deliver_node"),
        F.col("received.ts_us").alias("received_us"),
        F.col("acked.ts_us").alias("acked_us"),
        fate.alias("fate"), reason.alias("reason"),
        *[F.col(s).alias(f"{s}_at") for s in ("received", "committed", "routed", "delivered", "acked")],
    )
    out = j.select(*base, "e2e_receipts", "client_logged")
    judged = F.coalesce(F.col("client_logged"), F.lit(False)) & F.col("publisher_seq").isNotNull()
    got = F.coalesce(F.col("e2e_receipts"), F.lit(0))
    e2e_fate = (F.when(~judged, F.lit(None))
                .when(got > 1, "duplicated").when(got == 1, "received")
                .when(F.col("fate") == "pending", "pending")
                .when(F.col("fate").isin("dropped", "expired"), F.col("fate"))
                .otherwise("lost"))
    return out.select(
        *[c for c in out.columns if c not in ("e2e_receipts", "client_logged")],
        F.when(judged, got.cast("int")).alias("e2e_receipts"),
        e2e_fate.alias("e2e_fate"),
        F.date_trunc("hour", F.timestamp_micros("routed_us")).alias("hour"),
        F.date_format(F.timestamp_micros("routed_us"), "yyyy-MM-dd").alias("date"),
    )


def ingress_drops(drop_rows: DataFrame) -> DataFrame:
    """Messages dropped before routing (no subscriber involved), by reason (the last one given per message).

    drop_rows: drops().
    """
    per_msg = drop_rows.where(F.col("subscriber").isNull())
    return (per_msg.where(F.col("reason").isNotNull())
            .groupBy("fleet", "reason").agg(F.count(F.lit(1)).alias("messages")))
