"""Ordering transforms: per (publisher, subscriber) stream, which deliveries came late and by how much.

Publish order is the publisher's sequence number when it sends one, else the broker's receive time. Arrival order is
the time of the first delivery to the subscriber. A delivery is *late* when some message published after it arrived
before it. Its *displacement* is the number of such later-published messages that overtook it, and a stream's
*inversions* are the sum of its displacements (pairs in the wrong order). Published A B C D E, arriving A D E B C:
B and C are late (2 late deliveries), each displaced by 2 (D and E), so the stream has 4 inversions.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

STREAM = ("fleet", "publisher", "subscriber")


def delivered(fate_rows: DataFrame) -> DataFrame:
    """The (message, subscriber) rows that arrived and belong to a stream: what ordering looks at."""
    return fate_rows.where(F.col("first_delivered_us").isNotNull() & F.col("publisher").isNotNull())


def arrivals(fate_rows: DataFrame) -> DataFrame:
    """Delivered (message, subscriber) rows with publish rank and arrival position within their stream."""
    ranked = delivered(fate_rows).withColumn("pub_rank", F.coalesce(F.col("publisher_seq"), F.col("received_us")))
    by_arrival = Window.partitionBy(*STREAM).orderBy("first_delivered_us", "pub_rank", "msg_id")
    before = by_arrival.rowsBetween(Window.unboundedPreceding, -1)
    return ranked.select(
        *STREAM, "msg_id", "pub_rank", "first_delivered_us", "deliver_node", "node", "device", "firmware", "hour",
        F.row_number().over(by_arrival).alias("arrival_pos"),
        F.max("pub_rank").over(before).alias("max_rank_before"),
    ).withColumn("late", F.coalesce(F.col("max_rank_before") > F.col("pub_rank"), F.lit(False)))


def late_deliveries(arrival_rows: DataFrame) -> DataFrame:
    """One row per late delivery: displacement and how long after the first overtaking message it arrived."""
    late = arrival_rows.where("late").select(
        *STREAM, "msg_id", "pub_rank", "arrival_pos", "first_delivered_us", "deliver_node", "node", "device",
        "firmware", "hour")
    others = arrival_rows.select(*STREAM, F.col("pub_rank").alias("o_rank"), F.col("arrival_pos").alias("o_pos"),
                                 F.col("first_delivered_us").alias("o_us"))
    overtaken = late.join(others, list(STREAM)).where(
        (F.col("o_rank") > F.col("pub_rank")) & (F.col("o_pos") < F.col("arrival_pos")))
    return (overtaken.groupBy(*late.columns).agg(
        F.count(F.lit(1)).cast("int").alias("displacement"),
        F.min("o_us").alias("first_overtaker_us"))
        .withColumn("late_by_us", F.col("first_delivered_us") - F.col("first_overtaker_us"))
        .withColumnRenamed("pub_rank", "publish_rank").drop("arrival_pos", "first_overtaker_us"))


def streams(arrival_rows: DataFrame, late_rows: DataFrame) -> DataFrame:
    """Per stream: deliveries, late deliveries, inversion count and the largest displacement.

    arrival_rows: arrivals() or just delivered() (only the stream columns are counted).
    """
    counts = arrival_rows.groupBy(*STREAM).agg(F.count(F.lit(1)).alias("deliveries"))
    lateness = late_rows.groupBy(*STREAM).agg(
        F.count(F.lit(1)).alias("late"), F.sum("displacement").alias("inversions"),
        F.max("displacement").alias("max_displacement"))
    return (counts.join(lateness, list(STREAM), "left")
            .select(*STREAM, "deliveries",
                    F.coalesce("late", F.lit(0)).cast("long").alias("late"),
                    F.coalesce("inversions", F.lit(0)).cast("long").alias("inversions"),
                    F.coalesce("max_displacement", F.lit(0)).cast("int").alias("max_displacement")))
