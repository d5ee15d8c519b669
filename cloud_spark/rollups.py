"""Roll-up transforms (per fleet / device / node / firmware / hour) and incident windows joined with what went wrong."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cloud_spark.fate import FATES
from cloud_spark.latency import ACCURACY, QUANTILES

DIMENSIONS: dict[str, tuple[str, ...]] = {
    "fleet": ("fleet",), "device": ("fleet", "device"), "node": ("fleet", "node"),
    "firmware": ("fleet", "firmware"), "hour": ("fleet", "hour"),
}


def _count(cond: Column) -> Column:
    return F.sum(F.when(cond, 1).otherwise(0)).cast("long")


KEYS = ("fleet", "device", "node", "firmware", "hour")


def _set_id(keys: tuple[str, ...]) -> int:
    """grouping_id() of one grouping set over KEYS: a bit per key left out, the first key the highest bit."""
    return sum(1 << (len(KEYS) - 1 - i) for i, k in enumerate(KEYS) if k not in keys)


def rollup_sets(fate_rows: DataFrame, late_rows: DataFrame) -> DataFrame:
    """Every dimension's roll-up in one grouping-sets pass over the fates: `dimension`, KEYS (null if unused), counts.

    Counts of each fate, duplicates, late deliveries and receive->deliver latency; rollup_of picks one dimension.
    """
    sets = [[F.col(k) for k in keys] for keys in DIMENSIONS.values()]
    dim = F.lit(None).cast("string")
    for name, keys in DIMENSIONS.items():
        dim = F.when(F.col("_set") == _set_id(keys), F.lit(name)).otherwise(dim)
    delivered = F.col("delivered_at")
    same_boot = (F.col("received_at.node") == delivered.node) & (F.col("received_at.boot_id") == delivered.boot_id)
    lat = F.when(same_boot, delivered.ts_mono_us - F.col("received_at.ts_mono_us")).when(
        F.col("received_at.boot_synced") & delivered.boot_synced, delivered.ts_us - F.col("received_at.ts_us"))
    q = F.percentile_approx(lat, list(QUANTILES), ACCURACY)
    counts = fate_rows.groupingSets(sets, *KEYS).agg(
        F.grouping_id().alias("_set"),
        F.count(F.lit(1)).alias("pairs"),
        *[_count(F.col("fate") == f).alias(f) for f in FATES],
        _count(F.col("duplicated")).alias("duplicated"),
        _count(F.col("e2e_fate") == "lost").alias("e2e_lost"),
        q[0].alias("deliver_p50_us"), q[1].alias("deliver_p95_us"), q[2].alias("deliver_p99_us"),
    ).withColumn("dimension", dim)
    late = late_rows.groupingSets(sets, *KEYS).agg(
        F.grouping_id().alias("_set"), F.count(F.lit(1)).alias("late"), F.sum("displacement").alias("inversions"))
    late = late.withColumn("dimension", dim).select(
        *[F.col(c).alias(f"_l_{c}") for c in ("dimension", *KEYS)], "late", "inversions")
    on = [F.col(c).eqNullSafe(F.col(f"_l_{c}")) for c in ("dimension", *KEYS)]
    return (counts.join(late, on, "left")
            .select("dimension", *KEYS, *[c for c in counts.columns if c not in (*KEYS, "_set", "dimension")],
                    F.coalesce("late", F.lit(0)).cast("long").alias("late"),
                    F.coalesce("inversions", F.lit(0)).cast("long").alias("inversions")))


def rollup_of(set_rows: DataFrame, dimension: str) -> DataFrame:
    """One dimension's roll-up from rollup_sets' rows: its keys, then the counts."""
    keys = DIMENSIONS[dimension]
    drop = {"dimension", *KEYS}
    return (set_rows.where(F.col("dimension") == dimension)
            .select(*keys, *[c for c in set_rows.columns if c not in drop]))


def rollup(fate_rows: DataFrame, late_rows: DataFrame, dimension: str) -> DataFrame:
    """One dimension's roll-up (rollup_of over rollup_sets)."""
    return rollup_of(rollup_sets(fate_rows, late_rows), dimension)


LIFECYCLE = ("peer_down", "peer_up", "node_stop", "node_start")


def lifecycle(timed: DataFrame) -> DataFrame:
    """The peer and node lifecycle events incidents are made of (a small table)."""
    return timed.where(F.col("kind").isin(*LIFECYCLE)).select("fleet", "device", "node", "peer_node", "kind", "ts_us")


def incidents(lifecycle_rows: DataFrame, timed: DataFrame, window_end_us: int) -> DataFrame:
    """peer_down..peer_up, node_stop..node_start and node_crash windows (see crashes).

    lifecycle_rows: lifecycle(timed). An unclosed peer_down or node_stop window ends at the analysis window's end.
    """
    ev = lifecycle_rows.select(
        "fleet", "device", "node", "peer_node", "kind", "ts_us",
        F.when(F.col("kind").startswith("peer"), "peer_down").otherwise("node_stop").alias("incident"))
    key = ["fleet", "node", "incident", F.coalesce("peer_node", F.lit(""))]
    w = Window.partitionBy(*key).orderBy("ts_us", "kind")
    opens = F.col("kind").isin("peer_down", "node_stop")
    closes = ~opens
    nxt_close = F.min(F.when(closes, F.col("ts_us"))).over(w.rowsBetween(1, Window.unboundedFollowing))
    prev_kind = F.lag("kind").over(w)
    marked = ev.select("*", nxt_close.alias("end_us"), prev_kind.alias("prev_kind"))
    starts = marked.where(opens & (F.col("prev_kind").isNull() | ~F.col("prev_kind").isin("peer_down", "node_stop")))
    return starts.select(
        "fleet", "incident", "device", "node", "peer_node", F.col("ts_us").alias("start_us"),
        F.coalesce("end_us", F.lit(window_end_us)).alias("end_us"), F.col("end_us").isNull().alias("open"),
        ((F.coalesce("end_us", F.lit(window_end_us)) - F.col("ts_us")) / 1e6).alias("duration_s"),
    ).unionByName(crashes(lifecycle_rows, timed))


def crashes(lifecycle_rows: DataFrame, timed: DataFrame) -> DataFrame:
    """node_crash windows: a node_start whose previous run (since the node's previous node_start) has no node_stop.

    A process killed with -9 writes no node_stop; the evidence is the restart. The window runs from the previous
    run's last event to the new node_start. Each event is matched to the one run it belongs to through a broadcast
    join with the (few) node_start events, so no event is sorted or shuffled. A node that died and never restarted
    leaves no evidence here (its logs simply stop) and is not reported.
    """
    starts = lifecycle_rows.where(F.col("kind") == "node_start").select(
        "fleet", "node", "device", F.col("ts_us").alias("run_start_us"))
    by_node = Window.partitionBy(F.col("fleet"), F.col("node")).orderBy("run_start_us")
    runs = starts.withColumn("prev_start_us", F.lag("run_start_us").over(by_node))
    ev = timed.select("fleet", "node", F.col("ts_us").alias("ev_us"), F.col("kind").alias("ev_kind"))
    before = (F.col("ev_us") < F.col("run_start_us")) & (
        F.col("prev_start_us").isNull() | (F.col("ev_us") >= F.col("prev_start_us")))
    prev_run = (ev.join(F.broadcast(runs), ["fleet", "node"]).where(before)
                .groupBy("fleet", "node", "device", "run_start_us")
                .agg(F.max("ev_us").alias("last_us"), _count(F.col("ev_kind") == "node_stop").alias("stops")))
    return prev_run.where(F.col("stops") == 0).select(
        "fleet", F.lit("node_crash").alias("incident"), "device", "node", F.lit(None).cast("string").alias("peer_node"),
        F.col("last_us").alias("start_us"), F.col("run_start_us").alias("end_us"), F.lit(False).alias("open"),
        ((F.col("run_start_us") - F.col("last_us")) / 1e6).alias("duration_s"))


def incident_impact(incident_rows: DataFrame, fate_rows: DataFrame, late_rows: DataFrame) -> DataFrame:
    """Losses and reorderings inside each incident window on the nodes it involves (the node and its peer)."""
    inc = incident_rows.withColumn("incident_id", F.concat_ws(
        "|", "fleet", "incident", "node", F.coalesce("peer_node", F.lit("")), F.col("start_us").cast("string")))
    win = inc.select("incident_id", F.col("fleet").alias("i_fleet"), F.col("node").alias("i_node"),
                     F.col("peer_node").alias("i_peer"), F.col("start_us").alias("i_start"),
                     F.col("end_us").alias("i_end"))

    def inside(ts: str) -> Column:
        on_node = F.lit(False)
        for c in ("node", "deliver_node"):
            on_node = on_node | (F.col(c) == F.col("i_node")) | (F.col(c) == F.col("i_peer"))
        return ((F.col("fleet") == F.col("i_fleet")) & (F.col(ts) >= F.col("i_start"))
                & (F.col(ts) <= F.col("i_end")) & on_node)

    harms = ("lost", "dropped", "expired", "delivered_not_acked")
    bad = fate_rows.where(F.col("fate").isin(*harms)).select("fleet", "node", "deliver_node", "routed_us", "fate")
    hit = (F.broadcast(win).join(bad, inside("routed_us"))
           .groupBy("incident_id").agg(*[_count(F.col("fate") == f).alias(f) for f in harms]))
    lr = late_rows.select("fleet", "node", "deliver_node", "first_delivered_us")
    late = (F.broadcast(win).join(lr, inside("first_delivered_us"))
            .groupBy("incident_id").agg(F.count(F.lit(1)).alias("late")))
    out = inc.join(hit, "incident_id", "left").join(late, "incident_id", "left")
    for c in (*harms, "late"):
        out = out.withColumn(c, F.coalesce(c, F.lit(0)).cast("long"))
    return out.drop("incident_id")
