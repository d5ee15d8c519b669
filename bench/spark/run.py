"""Spark pipeline benchmark: generate N events, time `python -m cloud_spark run` on local[2], check the counts.

    python -m bench.spark.run --events 1000000 10000000 [--master local[2]] [--format parquet|jsonl]

The run's own progress (step lines and Spark's stage bars) streams to the terminal. Wall time, events/s, the CPU
seconds the run used (JVM included: on a shared machine this is the figure that does not depend on the other load),
each step's wall time, the load average before and after, and whether the report's counts equal the injected ones
are printed as Markdown and stored in bench/out/spark.json. A run over --timeout seconds is killed and reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cloud_spark.generator import FleetSpec, generate

ROOT = Path(__file__).resolve().parents[2]


def _progress(done: int, total: int) -> None:
    print(f"\r  generate: {done}/{total} devices", end="" if done < total else "\n", file=sys.stderr, flush=True)


STEP = re.compile(r"\[cloud_spark\] (.+) done in ([0-9.]+)s")


class GroupCpu(threading.Thread):
    """Polls the CPU seconds of every process in one process group (the run and its JVM) until stopped."""

    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.stop = pgid, threading.Event()
        self.seen: dict[str, float] = {}
        self.tick = os.sysconf("SC_CLK_TCK")

    def sample(self) -> None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pgid:  # fields: state ppid pgrp ... utime(11) stime(12)
                self.seen[pid] = (int(fields[11]) + int(fields[12])) / self.tick

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.sample()

    def total(self) -> float:
        """CPU seconds used so far by the group's processes (last sample of each)."""
        return sum(self.seen.values())


def _relay(stream: object, steps: dict[str, float]) -> None:
    """Copy the run's stderr (progress) to ours and note every finished step's time."""
    buf = b""
    for chunk in iter(lambda: stream.read1(4096), b""):  # type: ignore[attr-defined]
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        buf = (buf + chunk)[-8192:]
        *lines, buf = re.split(rb"[\r\n]", buf)
        for line in lines:
            m = STEP.search(line.decode(errors="replace"))
            if m:
                name = m.group(1)
                steps[name.split(":")[0] if name.startswith("ingest") else name.split(":")[-1].strip()] = \
                    float(m.group(2))


def run_one(events: int, master: str, work: Path, driver_memory: str, fmt: str, timeout: float) -> dict[str, object]:
    """Generate `events` events, run the pipeline once, return its figures."""
    src, out = work / f"src-{events}", work / f"out-{events}"
    t0 = time.monotonic()
    man = generate(FleetSpec.for_events(events), str(src), progress=_progress, fmt=fmt)
    gen_s = time.monotonic() - t0
    shutil.rmtree(out, ignore_errors=True)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "cloud_spark", "--master", master, "--driver-memory", driver_memory,
           "run", str(src), str(out)]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    steps: dict[str, float] = {}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: a timeout kills it and its JVM only
    relay = threading.Thread(target=_relay, args=(proc.stderr, steps), daemon=True)
    relay.start()
    cpu = GroupCpu(proc.pid)
    cpu.start()
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    relay.join(timeout=10)
    wall = time.monotonic() - t0
    cpu.stop.set()
    cpu.join()
    load_after = os.getloadavg()
    n = int(man["events"])  # type: ignore[call-overload]
    row: dict[str, object] = {
        "events": n, "format": fmt, "generate_s": round(gen_s, 1), "wall_s": round(wall, 1),
        "events_per_s": round(n / wall), "cpu_s": round(cpu.total(), 1), "steps_s": steps,
        "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in load_after],
        "master": master, "completed": code == 0, "exit": code}
    if code != 0:
        return {**row, "counts_exact": None}
    summary = json.loads((out / "summary.json").read_text())
    exp = man["expected"]
    row["counts_exact"] = (summary["fates"] == exp["fates"]  # type: ignore[index]
                           and summary["duplicated"] == exp["duplicated"]  # type: ignore[index]
                           and summary["ordering"]["late"] == exp["late"])  # type: ignore[index]
    return row


def main() -> int:
    """Run each size, print the Markdown table, store the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--work", default="/tmp/bench-spark")
    ap.add_argument("--format", choices=("parquet", "jsonl"), default="parquet", help="generated segment format")
    ap.add_argument("--timeout", type=float, default=1800, help="kill a run after this many seconds")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for n in args.events:
        print(f"== {n:,} events on {args.master}", file=sys.stderr, flush=True)
        rows.append(run_one(n, args.master, work, args.driver_memory, args.format, args.timeout))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "spark.json").write_text(json.dumps(rows, indent=2))
    print(f"cores: {os.cpu_count()}")
    print("| events | format | wall s | events/s | CPU s | generate s | load avg before -> after | counts exact |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        wall = r["wall_s"] if r["completed"] else f"> {r['wall_s']} (killed)"
        print(f"| {r['events']:,} | {r['format']} | {wall} | {r['events_per_s']:,} | {r['cpu_s']} | "
              f"{r['generate_s']} | {r['load_before'][0]} -> {r['load_after'][0]} | {r['counts_exact']} |")
    for r in rows:
        print(f"steps at {r['events']:,}: " + ", ".join(f"{k} {v:.1f}s" for k, v in r["steps_s"].items()))
    done = [r for r in rows if r["completed"]]
    if len(done) >= 2:
        a, b = sorted(done, key=lambda r: int(r["events"]))[:: len(done) - 1]
        size = int(b["events"]) / int(a["events"])
        print(f"time per event, largest / smallest: {float(b['wall_s']) / float(a['wall_s']) / size:.2f}x wall, "
              f"{float(b['cpu_s']) / float(a['cpu_s']) / size:.2f}x CPU (1.0 = linear)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
