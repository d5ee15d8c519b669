"""HTML report with PNG plots, rendered on the driver from small aggregated tables only."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

TOP = 15
PLOTS = ("timeline.png", "latency.png", "worst_devices.png", "worst_streams.png")


def _timeline(spark: SparkSession, out: str, path: Path) -> None:
    hourly = (spark.read.parquet(f"{out}/rollup_hour").groupBy("hour")
              .agg(*[F.sum(c).alias(c) for c in ("pairs", "lost", "dropped", "expired", "duplicated", "late")])
              .orderBy("hour").limit(24 * 90).toPandas())
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for col, colour in (("lost", "#c0392b"), ("dropped", "#e67e22"), ("expired", "#8e44ad"),
                        ("duplicated", "#2980b9"), ("late", "#16a085")):
        ax.plot(hourly["hour"], hourly[col], marker="o", label=col, color=colour)
    ax.set_title("Loss, duplicates and reordering per hour (all fleets)")
    ax.set_ylabel("(message, subscriber) pairs")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _latency(spark: SparkSession, out: str, path: Path) -> None:
    hist = spark.read.parquet(f"{out}/latency_hist").orderBy("hop", "bucket").toPandas()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for hop, rows in hist.groupby("hop"):
        ax.step(rows["lower_us"] / 1000.0, rows["count"], where="post", label=str(hop))
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log scale)")
    ax.set_ylabel("messages")
    ax.set_title("Latency distribution per hop (trusted clocks only)")
    if hist.empty:
        ax.text(0.5, 0.5, "no latency measured", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _bars(labels: list[str], series: dict[str, list[float]], title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(len(labels), 3) + 1.2))
    left = [0.0] * len(labels)
    colours = ("#c0392b", "#e67e22", "#16a085", "#2980b9")
    for (name, values), colour in zip(series.items(), colours, strict=False):
        ax.barh(labels, values, left=left, label=name, color=colour)
        left = [a + b for a, b in zip(left, values, strict=True)]
    if not labels:
        ax.text(0.5, 0.5, "nothing went wrong", ha="center", va="center", transform=ax.transAxes)
    ax.invert_yaxis()
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _worst_devices(spark: SparkSession, out: str, path: Path) -> list[dict[str, Any]]:
    score = F.col("lost") + F.col("dropped") + F.col("expired") + F.col("late")
    top = (spark.read.parquet(f"{out}/rollup_device").where(score > 0).orderBy(score.desc(), "device")
           .limit(TOP).toPandas())
    labels = [f"{f}/{d}" for f, d in zip(top["fleet"], top["device"], strict=True)]
    _bars(labels, {c: top[c].tolist() for c in ("lost", "dropped", "late", "expired")},
          "Worst devices (lost, dropped, late, expired)", path)
    return top.to_dict("records")


def _worst_streams(spark: SparkSession, out: str, path: Path) -> list[dict[str, Any]]:
    top = (spark.read.parquet(f"{out}/streams").where("inversions > 0")
           .orderBy(F.col("inversions").desc(), "publisher", "subscriber").limit(TOP).toPandas())
    labels = [f"{p} -> {s}" for p, s in zip(top["publisher"], top["subscriber"], strict=True)]
    _bars(labels, {"inversions": top["inversions"].tolist(), "late": top["late"].tolist()},
          "Worst streams (inversions, late deliveries)", path)
    return top.to_dict("records")


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(spark: SparkSession, out: str, report_dir: str) -> Path:
    """Write report_dir/index.html and its PNGs; returns the HTML path."""
    rd = Path(report_dir)
    rd.mkdir(parents=True, exist_ok=True)
    summary = json.loads("\n".join(spark.sparkContext.textFile(f"{out}/summary.json").collect()))
    _timeline(spark, out, rd / PLOTS[0])
    _latency(spark, out, rd / PLOTS[1])
    devices = _worst_devices(spark, out, rd / PLOTS[2])
    streams = _worst_streams(spark, out, rd / PLOTS[3])
    fates = [{"fate": k, "pairs": v} for k, v in summary["fates"].items()]
    lat = [{"hop": h, **v} for h, v in summary["latency"].items()]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Fleet delivery report</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}img{{max-width:100%}}</style></head><body>
<h1>Fleet delivery report</h1>
<p>{summary['pairs']} (message, subscriber) pairs; {summary['fates']['lost']} lost,
{summary['duplicated']} duplicated, {summary['ordering']['late']} late deliveries
({summary['ordering']['inversions']} inversions), {summary['fates']['pending']} still pending at the window end.</p>
<h2>Fates</h2>{_table(fates, ["fate", "pairs"])}
<h2>Timeline</h2><img src="{PLOTS[0]}" alt="timeline">
<h2>Latency</h2>{_table(lat, ["hop", "measured", "untrusted_clock", "p50_us", "p95_us", "p99_us", "max_us"])}
<img src="{PLOTS[1]}" alt="latency">
<h2>Worst devices</h2><img src="{PLOTS[2]}" alt="worst devices">
{_table(devices, ["fleet", "device", "pairs", "lost", "dropped", "expired", "late", "duplicated"])}
<h2>Worst streams</h2><img src="{PLOTS[3]}" alt="worst streams">
{_table(streams, ["fleet", "publisher", "subscriber", "deliveries", "late", "inversions", "max_displacement"])}
<h2>Clocks, incidents, ingest</h2><pre>{html.escape(json.dumps(
        {k: summary[k] for k in ("clocks", "incidents", "ingest", "ingress_drops")}, indent=2))}</pre>
</body></html>"""
    index = rd / "index.html"
    index.write_text(page)
    return index
