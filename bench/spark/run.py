"""Spark pipeline benchmark: generate N events, time `python -m cloud_spark run` on local[2], check the counts.

    python -m bench.spark.run --events 1000000 10000000 [--master local[2]] [--work /tmp/bench-spark]

The run's own progress (step lines and Spark's stage bars) streams to the terminal. Wall time and events/s per size,
the machine's load average before and after, and whether the report's counts equal the injected ones are printed as
Markdown and stored in bench/out/spark.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cloud_spark.generator import FleetSpec, generate

ROOT = Path(__file__).resolve().parents[2]


def _progress(done: int, total: int) -> None:
    print(f"\r  generate: {done}/{total} devices", end="" if done < total else "\n", file=sys.stderr, flush=True)


def run_one(events: int, master: str, work: Path, driver_memory: str) -> dict[str, object]:
    """Generate `events` events, run the pipeline once, return its figures."""
    src, out = work / f"src-{events}", work / f"out-{events}"
    t0 = time.monotonic()
    man = generate(FleetSpec.for_events(events), str(src), progress=_progress)
    gen_s = time.monotonic() - t0
    shutil.rmtree(out, ignore_errors=True)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "cloud_spark", "--master", master, "--driver-memory", driver_memory,
           "run", str(src), str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)  # stderr (progress) goes to the terminal
    wall = time.monotonic() - t0
    load_after = os.getloadavg()
    summary = json.loads((out / "summary.json").read_text())
    exp = man["expected"]
    exact = (summary["fates"] == exp["fates"] and summary["duplicated"] == exp["duplicated"]  # type: ignore[index]
             and summary["ordering"]["late"] == exp["late"])  # type: ignore[index]
    n = int(man["events"])  # type: ignore[call-overload]
    return {"events": n, "generate_s": round(gen_s, 1), "wall_s": round(wall, 1), "events_per_s": round(n / wall),
            "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in load_after],
            "counts_exact": exact, "master": master}


def main() -> int:
    """Run each size, print the Markdown table, store the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--work", default="/tmp/bench-spark")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.events:
        print(f"== {n:,} events on {args.master}", file=sys.stderr, flush=True)
        rows.append(run_one(n, args.master, work, args.driver_memory))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "spark.json").write_text(json.dumps(rows, indent=2))
    print(f"cores: {os.cpu_count()}")
    print("| events | wall s | events/s | generate s | load avg before -> after | counts exact |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['events']:,} | {r['wall_s']} | {r['events_per_s']:,} | {r['generate_s']} | "
              f"{r['load_before'][0]} -> {r['load_after'][0]} | {r['counts_exact']} |")
    if len(rows) >= 2:
        a, b = sorted(rows, key=lambda r: int(r["events"]))[:: len(rows) - 1]  # type: ignore[call-overload]
        ratio = (float(b["wall_s"]) / float(a["wall_s"])) / (int(b["events"]) / int(a["events"]))  # type: ignore[arg-type]
        print(f"time per event, largest / smallest: {ratio:.2f}x (1.0 = linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
