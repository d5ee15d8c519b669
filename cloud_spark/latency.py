"""Latency transforms: per-hop latencies (monotonic within a boot, trusted wall clock across nodes), percentiles."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cloud_spark import stamps

HOPS = ("receive_commit", "receive_deliver", "deliver_ack", "forward_rtt", "inter_node")
QUANTILES = (0.5, 0.95, 0.99)
ACCURACY = 10_000
LAT_COLUMNS = ("fleet", "hop", "msg_id", "subscriber", "from_node", "to_node", "device", "firmware", "hour",
               "latency_us", "method", "clock_ok")


def _between(a: Column, b: Column) -> tuple[Column, Column, Column]:
    """Latency from stamp a to stamp b, the clock used, and whether that clock can be trusted."""
    same_boot = (a.node == b.node) & (a.boot_id == b.boot_id)
    latency = F.when(same_boot, b.ts_mono_us - a.ts_mono_us).otherwise(b.ts_us - a.ts_us)
    method = F.when(same_boot, "monotonic").otherwise("wall")
    ok = same_boot | (a.boot_synced & b.boot_synced)
    return latency, method, ok


def _hop(rows: DataFrame, hop: str, a: str, b: str, subscriber: Column) -> DataFrame:
    sa, sb = F.col(a), F.col(b)
    latency, method, ok = _between(sa, sb)
    return rows.where(sa.isNotNull() & sb.isNotNull()).select(
        "fleet", F.lit(hop).alias("hop"), "msg_id", subscriber.alias("subscriber"),
        sa.node.alias("from_node"), sb.node.alias("to_node"), sa.device.alias("device"),
        sa.firmware.alias("firmware"), F.date_trunc("hour", F.timestamp_micros(sa.ts_us)).alias("hour"),
        latency.alias("latency_us"), method.alias("method"), ok.alias("clock_ok"))


def forwards(timed: DataFrame, place_rows: DataFrame) -> DataFrame:
    """Per (message, forwarding node, peer): when it was forwarded and when the peer acknowledged it."""
    fw = timed.where(F.col("kind").isin("forwarded", "forward_acked") & F.col("msg_id").isNotNull())
    firsts = [c.alias(f"{k}_at_{part}") for k in ("forwarded", "forward_acked")
              for c, part in zip(stamps.first(F.col("kind") == k), ("place", "ts"), strict=True)]
    out = fw.groupBy("fleet", "msg_id", "node", "peer_node").agg(*firsts)
    for name in ("forwarded_at", "forward_acked_at"):
        out = stamps.attach(out, name, place_rows)
    return out


def hop_latencies(fate_rows: DataFrame, forward_rows: DataFrame, place_rows: DataFrame) -> DataFrame:
    """One row per measured hop of one message (and subscriber where the hop has one)."""
    no_sub = F.lit(None).cast("string")
    routed = F.col("routed_at")
    on_peer = (fate_rows.where(routed.isNotNull()).withColumn("place", stamps.stamp_place("fleet", routed))
               .withColumn("ts", routed.ts_us))
    peer_place, peer_ts = stamps.first(F.lit(True), ts="ts")
    firsts_on_node = stamps.attach(
        on_peer.groupBy("fleet", "msg_id", routed.node.alias("peer_node"))
        .agg(peer_place.alias("peer_at_place"), peer_ts.alias("peer_at_ts")), "peer_at", place_rows)
    fw = forward_rows.join(firsts_on_node, ["fleet", "msg_id", "peer_node"], "left")
    # every pair of a message carries the same ingress stamps: any one will do (max keeps it hash-aggregatable)
    msgs = fate_rows.groupBy("fleet", "msg_id").agg(*[
        F.max(c).alias(f"{name}_{part}") for name in ("received_at", "committed_at")
        for c, part in ((stamps.stamp_place("fleet", F.col(name)), "place"), (F.col(name).ts_us, "ts"))])
    for name in ("received_at", "committed_at"):
        msgs = stamps.attach(msgs, name, place_rows)
    parts = [
        _hop(msgs, "receive_commit", "received_at", "committed_at", no_sub),
        _hop(fate_rows, "receive_deliver", "received_at", "delivered_at", F.col("subscriber")),
        _hop(fate_rows, "deliver_ack", "delivered_at", "acked_at", F.col("subscriber")),
        _hop(fw, "forward_rtt", "forwarded_at", "forward_acked_at", no_sub),
        _hop(fw, "inter_node", "forwarded_at", "peer_at", no_sub),
    ]
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out


def latency_summary(lat_rows: DataFrame) -> DataFrame:
    """p50/p95/p99 per hop, per fleet and over all fleets (fleet '*'); untrusted-clock samples counted, not used.

    One grouping-sets pass: (fleet, hop) and (hop) together.
    """
    trusted = F.when(F.col("clock_ok"), F.col("latency_us"))
    q = F.percentile_approx(trusted, list(QUANTILES), ACCURACY)
    sets = lat_rows.groupingSets([[F.col("fleet"), F.col("hop")], [F.col("hop")]], "fleet", "hop").agg(
        F.grouping("fleet").alias("_all"),
        F.count(F.lit(1)).alias("measured"),
        F.sum(F.when(F.col("clock_ok"), 0).otherwise(1)).alias("untrusted_clock"),
        q[0].alias("p50_us"), q[1].alias("p95_us"), q[2].alias("p99_us"),
        F.max(trusted).alias("max_us"))
    fleet = F.when(F.col("_all") == 1, F.lit("*")).otherwise(F.col("fleet")).alias("fleet")
    return sets.select(fleet, "hop", "measured", "untrusted_clock", "p50_us", "p95_us", "p99_us", "max_us")


def latency_histogram(lat_rows: DataFrame) -> DataFrame:
    """Counts per hop in log-spaced buckets (ten per decade), trusted samples only: what the report plots."""
    lat = F.greatest(F.col("latency_us"), F.lit(1)).cast("double")
    bucket = F.floor(F.log10(lat) * 10).cast("int")
    return (lat_rows.where("clock_ok").groupBy("hop", bucket.alias("bucket"))
            .agg(F.count(F.lit(1)).alias("count"))
            .withColumn("lower_us", F.pow(F.lit(10.0), F.col("bucket") / 10.0)))
