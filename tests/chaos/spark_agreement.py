"""Feed one chaos run's delivery logs (client receipts + broker logs) to the cloud_spark job; compare with the checker.

The Spark job judges per (message id, subscriber); the checker per (publisher, seq, subscriber). Both are brought to
(publisher, seq, subscriber) keys and compared as sets:
  lost        Spark e2e_fate "lost"            == checker lost (messages the publisher never saw acked are left out:
                                                  the checker calls them indeterminate, Spark cannot know about acks)
  duplicated  Spark e2e_fate "duplicated"      == checker duplicated (QoS1 and QoS2)
  late        Spark's late-delivery table      == checker reordered
restricted to the keys Spark could judge end to end (see `unjudged`), whose number the test reports.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.deliverylog.segments import closed_segments
from appliance.deliverylog.upload import first_record, object_key

from .checker import Result

Key = tuple[str, int, str]


def segment_records(path: Path) -> list[dict[str, Any]]:
    """Every record of one closed segment, Parquet or gzip JSON Lines."""
    if path.name.endswith(".parquet"):
        from appliance.deliverylog.columnar import read_parquet_records

        return read_parquet_records(str(path))
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


def broker_logged(run_dir: Path) -> set[tuple[str, int]]:
    """(publisher, seq) of every message some node's delivery log recorded as received."""
    found: set[tuple[str, int]] = set()
    for directory in sorted(run_dir.glob("node*/deliverylog")):
        for name in closed_segments(str(directory)):
            for rec in segment_records(directory / name):
                if rec["kind"] == "received" and rec.get("publisher_seq") is not None:
                    found.add((rec["publisher"], int(rec["publisher_seq"])))
    return found


def stage_segments(run_dir: Path, stage: Path) -> int:
    """Copy every closed segment of the run (client receipts, node delivery logs) into the upload layout."""
    sources = [run_dir / "clients" / "receipts", *sorted(run_dir.glob("node*/deliverylog"))]
    copied = 0
    for src in sources:
        if not src.is_dir():
            continue
        for name in closed_segments(str(src)):
            dest = stage / object_key("", name, first_record(str(src / name)))
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, dest)
            copied += 1
    return copied


def inject_client_faults(run_dir: Path, subscriber: str, lose: tuple[str, int], duplicate: tuple[str, int]) -> None:
    """Make `subscriber` lose one delivery and see another twice, in its history and its receipts alike.

    This is what a broker bug would leave in the client's records; the checker and Spark must both report exactly
    these (on top of whatever the run itself produced). The clients write gzip JSON Lines receipts (workload.py).
    """
    history = run_dir / "clients" / "history.jsonl"
    kept = []
    for line in history.read_text().splitlines():
        ev = json.loads(line)
        key = (ev.get("pub"), ev.get("seq"))
        if ev["e"] == "recv" and ev["c"] == subscriber and ev["app"]:
            if key == lose:
                continue
            if key == duplicate:
                kept.append(line)
                line = json.dumps({**ev, "dup": True})
        kept.append(line)
    history.write_text("\n".join(kept) + "\n")
    receipts = run_dir / "clients" / "receipts"
    for name in closed_segments(str(receipts)):
        path = receipts / name
        if not name.endswith(".jsonl.gz"):
            raise ValueError(f"{path}: fault injection edits gzip JSON Lines receipts only")
        records = segment_records(path)
        if not records or records[0]["node"] != subscriber:
            continue
        out = []
        for rec in records:
            key = (rec.get("publisher"), rec.get("publisher_seq"))
            if rec["kind"] == "client_received" and key == lose:
                continue
            out.append(rec)
            if rec["kind"] == "client_received" and key == duplicate:
                out.append({**rec, "event_id": rec["event_id"] + "0000000", "dup": True})  # a second receipt
        with gzip.open(path, "wt") as out_fh:
            out_fh.writelines(json.dumps(rec) + "\n" for rec in out)


@dataclass
class SparkView:
    """What the Spark job reported, as (publisher, seq, subscriber) key sets, plus its summary."""

    summary: dict[str, Any]
    keys: dict[str, set[Key]] = field(default_factory=dict)


def spark_view(spark: Any, stage: Path, out: Path) -> SparkView:
    """Run the ingest and analyze jobs in local mode; read back their fate and late tables (small: one run)."""
    from pyspark.sql import functions as F

    from cloud_spark import jobs

    stats = jobs.ingest_job(spark, str(stage), str(out), parquet=True)  # node logs: Parquet by default
    summary = jobs.analyze_job(spark, str(out), grace_us=0, ingest_summary=stats)
    fate = spark.read.parquet(f"{out}/fate")
    keys: dict[str, set[Key]] = {}
    rows = (fate.where(F.col("e2e_fate").isNotNull()).select("publisher", "publisher_seq", "subscriber", "e2e_fate")
            .distinct().collect())
    for name in ("lost", "duplicated", "received"):
        keys[name] = {(r["publisher"], int(r["publisher_seq"]), r["subscriber"]) for r in rows if r["e2e_fate"] == name}
    keys["judged"] = {(r["publisher"], int(r["publisher_seq"]), r["subscriber"]) for r in rows}
    late = spark.read.parquet(f"{out}/late").select("publisher", "publish_rank", "subscriber").distinct().collect()
    keys["late"] = {(r["publisher"], int(r["publish_rank"]), r["subscriber"]) for r in late}
    return SparkView(summary, keys)


def unjudged(result: Result, view: SparkView) -> set[Key]:
    """Checker-classified (message, subscriber) keys Spark could not judge end to end.

    The broker's delivery log is written asynchronously, so a kill -9 can take a message's `received` event with it;
    Spark then has no publisher / sequence number for that message id and cannot join it with client receipts.
    """
    classified = result.keys["lost"] | result.keys["duplicated"] | result.keys["reordered"] | result.keys["ok"]
    return classified - view.keys["judged"]


def disagreements(result: Result, view: SparkView) -> list[str]:
    """Where Spark and the checker differ on the keys Spark could judge (empty when they agree)."""
    out = []
    judged = view.keys["judged"]
    spark_lost = view.keys["lost"] - result.keys["not_acked"]
    for name, spark_keys, ours in (("lost", spark_lost, result.keys["lost"] & judged),
                                   ("duplicated", view.keys["duplicated"], result.keys["duplicated"] & judged),
                                   ("late/reordered", view.keys["late"], result.keys["reordered"] & judged)):
        if spark_keys != ours:
            only_spark = sorted(spark_keys - ours)[:5]
            only_checker = sorted(ours - spark_keys)[:5]
            out.append(f"{name}: spark={len(spark_keys)} checker={len(ours)} only spark {only_spark} "
                       f"only checker {only_checker}")
    return out
