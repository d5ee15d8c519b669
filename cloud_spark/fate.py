"""Fate transforms: what became of each message for each intended subscriber, broker-side and end to end."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

FATES = ("acked", "delivered", "delivered_not_acked", "dropped", "expired", "lost", "pending")
PAIR_KINDS = ("routed", "queued_offline", "delivered", "acked", "expired", "dropped")
STAMP_FIELDS = ("node", "device", "firmware", "boot_id", "ts_mono_us", "ts_us", "boot_synced")
DEFAULT_GRACE_US = 60_000_000


def _first(kind: str, col: Column | None = None) -> Column:
    """The stamp (where and when) of the earliest event of this kind in the group."""
    value = col if col is not None else F.struct(*STAMP_FIELDS)
    return F.min_by(F.when(F.col("kind") == kind, value), F.when(F.col("kind") == kind, F.col("ts_us")))


def _count(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0))


def messages(timed: DataFrame) -> DataFrame:
    """One row per message: ingress stamps (received, committed) and the publisher's identity."""
    broker = timed.where((F.col("source") == "broker") & F.col("msg_id").isNotNull())
    ingress = broker.where(F.col("kind").isin("received", "committed", "dropped") & F.col("subscriber").isNull())
    return ingress.groupBy("fleet", "msg_id").agg(
        _first("received").alias("received"),
        _first("committed").alias("committed"),
        F.max(F.when(F.col("kind") == "received", F.col("publisher"))).alias("publisher"),
        F.max(F.when(F.col("kind") == "received", F.col("publisher_seq"))).alias("publisher_seq"),
        F.max(F.when(F.col("kind") == "received", F.col("topic"))).alias("topic"),
        F.max(F.when(F.col("kind") == "received", F.col("qos"))).alias("msg_qos"),
        F.max_by(F.when(F.col("kind") == "dropped", F.col("reason")),
                 F.when(F.col("kind") == "dropped", F.col("ts_us"))).alias("ingress_drop_reason"),
    )


def pairs(timed: DataFrame) -> DataFrame:
    """One row per (message, intended subscriber) seen in any per-subscriber broker event."""
    kind = F.col("kind")
    per_sub = timed.where((F.col("source") == "broker") & F.col("msg_id").isNotNull()
                          & F.col("subscriber").isNotNull() & kind.isin(*PAIR_KINDS))
    return per_sub.groupBy("fleet", "msg_id", "subscriber").agg(
        _first("routed").alias("routed"),
        _first("delivered").alias("delivered"),
        _first("acked").alias("acked"),
        F.max(F.when(kind.isin("routed", "delivered"), F.col("qos"))).alias("pair_qos"),
        _count(kind == "delivered").alias("deliveries"),
        _count((kind == "delivered") & F.coalesce(F.col("dup"), F.lit(False))).alias("dup_flag_deliveries"),
        _count(kind == "queued_offline").alias("queued"),
        _count(kind == "expired").alias("expired"),
        F.max_by(F.when(kind == "dropped", F.coalesce(F.col("reason"), F.lit("unspecified"))),
                 F.when(kind == "dropped", F.col("ts_us"))).alias("drop_reason"),
        F.max("ts_us").alias("last_us"),
        F.max_by(F.struct("node", "device", "firmware"), F.col("ts_us")).alias("last_seen"),
    )


def receipts(timed: DataFrame) -> DataFrame:
    """Client-side receipts per (publisher, publisher_seq, receiving client)."""
    got = timed.where((F.col("source") == "client") & (F.col("kind") == "client_received")
                      & F.col("publisher_seq").isNotNull())
    return (got.withColumn("receiver", F.coalesce("subscriber", "node"))
            .groupBy("fleet", "publisher", "publisher_seq", "receiver")
            .agg(F.count(F.lit(1)).alias("e2e_receipts"), F.min("ts_us").alias("e2e_first_us")))


def logged_clients(timed: DataFrame) -> DataFrame:
    """The clients that uploaded any receipt log: only for them can end-to-end loss be judged."""
    return timed.where(F.col("source") == "client").select("fleet", F.col("node").alias("receiver")).distinct()


def fates(pair_rows: DataFrame, message_rows: DataFrame, receipt_rows: DataFrame, clients: DataFrame,
          window_end_us: int, grace_us: int = DEFAULT_GRACE_US) -> DataFrame:
    """Classify every (message, subscriber); `pending` when the outcome could still change after the window end."""
    j = pair_rows.join(message_rows, ["fleet", "msg_id"], "left")
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
    base = j.select(
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
    rec = receipt_rows.withColumnRenamed("receiver", "subscriber")
    cl = clients.withColumnRenamed("receiver", "subscriber").withColumn("client_logged", F.lit(True))
    out = (base.join(rec, ["fleet", "publisher", "publisher_seq", "subscriber"], "left")
           .join(F.broadcast(cl), ["fleet", "subscriber"], "left"))
    judged = F.coalesce(F.col("client_logged"), F.lit(False)) & F.col("publisher_seq").isNotNull()
    got = F.coalesce(F.col("e2e_receipts"), F.lit(0))
    e2e_fate = (F.when(~judged, F.lit(None))
                .when(got > 1, "duplicated").when(got == 1, "received")
                .when(F.col("fate") == "pending", "pending")
                .when(F.col("fate").isin("dropped", "expired"), F.col("fate"))
                .otherwise("lost"))
    return out.select(
        *base.columns,
        F.when(judged, got.cast("int")).alias("e2e_receipts"),
        e2e_fate.alias("e2e_fate"),
        F.date_trunc("hour", F.timestamp_micros("routed_us")).alias("hour"),
        F.date_format(F.timestamp_micros("routed_us"), "yyyy-MM-dd").alias("date"),
    )


def ingress_drops(message_rows: DataFrame) -> DataFrame:
    """Messages dropped before routing (no subscriber involved), by reason."""
    return (message_rows.where(F.col("ingress_drop_reason").isNotNull())
            .groupBy("fleet", F.col("ingress_drop_reason").alias("reason")).agg(F.count(F.lit(1)).alias("messages")))
