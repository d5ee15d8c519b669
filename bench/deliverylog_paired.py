"""Issue #5's ratio measured in pairs: our broker with delivery logging off and on, loaded in turn, seconds apart.

Run: .venv/bin/python -m bench.deliverylog_paired [--pairs 30] [--duration 3] [--format parquet] [--json FILE]
Two broker nodes run for the whole benchmark, both pinned to the broker core: one with logging off, one with it on
(its writer child moved to the load generator's core, as on a multi-core device). Each pair loads one and then the
other (the order alternates) with the same QoS1 pipelined load. This VM's speed swings by a third within seconds
(the broker rounds in deliverylog_bench start fresh processes tens of seconds apart and see it whole); a pair's two
halves share the weather, so the median of the pair ratios is the steady figure. Reports that median with a
bootstrap 95 % interval, each side's median rate and CPU per message, and log bytes per delivered message.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.brokers import BROKER_CPU, LOADGEN_CPU, pinned
from bench.deliverylog_bench import RECORDER_ENV, _children, _cpu_seconds, _segment_bytes, _thread_cpu

TARGET = 0.85  # issue #5: throughput with logging on >= 0.85 x logging off


class _Node:
    """One broker node of the benchmark (bench.deliverylog_bench's `serve`), logging off or on."""

    def __init__(self, root: str, fmt: str | None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.fmt = fmt
        self.dir = os.path.join(root, fmt or "off")
        self.log_dir = os.path.join(self.dir, "deliverylog") if fmt else ""
        argv = [sys.executable, "-m", "bench.deliverylog_bench", "serve", f"127.0.0.1:{self.port}",
                os.path.join(self.dir, "data"), self.log_dir, "process", fmt or "parquet"]
        self.proc = subprocess.Popen(pinned(BROKER_CPU, argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the node accepts TCP connections; RuntimeError if it does not in `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"broker ({self.fmt or 'logging off'}) did not start") from None
                time.sleep(0.05)

    def load(self, duration: float, window: int = 64) -> dict[str, float]:
        """One QoS1 pipelined load of `duration` s (`window` unacked per publisher): rate, count, CPU s and more."""
        cpu0, threads0 = _cpu_seconds(self.proc.pid), _thread_cpu(self.proc.pid)
        out = subprocess.run(pinned(LOADGEN_CPU, [sys.executable, "-m", "bench.loadgen", "qos1", "--max-messages",
                                                  "2000000", "--port", str(self.port), "--duration", str(duration),
                                                  "--window", str(window)]),
                             capture_output=True, text=True, timeout=300, check=True).stdout
        cpu1, threads1 = _cpu_seconds(self.proc.pid), _thread_cpu(self.proc.pid)
        result = json.loads(out.strip().splitlines()[-1])
        row = {"rate": result["delivered_rate"], "delivered": result["delivered"],
               "cpu_broker": cpu1[0] - cpu0[0], "cpu_tree": cpu1[1] - cpu0[1]}
        for tid, seconds in threads1.items():
            name = "thread main" if tid == self.proc.pid else f"thread {self.thread_names().get(tid, 'other')}"
            row[name] = row.get(name, 0.0) + seconds - threads0.get(tid, 0.0)
        return row

    def thread_names(self) -> dict[int, str]:
        """The node's thread names by native id (written by `serve` once started)."""
        try:
            with open(os.path.join(self.dir, "data", "threads.json")) as f:
                return {int(k): v for k, v in json.load(f).items()}
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        """SIGTERM and wait (the node closes its open segment)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def median_interval(values: list[float], resamples: int = 2000, seed: int = 5) -> tuple[float, float]:
    """A bootstrap 95 % interval of the median of `values` (percentile method, seeded)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def run(pairs: int, duration: float, fmt: str, window: int = 64, recorder: str = "auto") -> dict[str, Any]:
    """Load the off and on nodes in `pairs` alternating pairs; the figures as a dict (printed as it goes).

    recorder: the on node's hot-event recorder, auto (the C one where built), native or pure (Python lanes).
    """
    if recorder == "auto":
        os.environ.pop(RECORDER_ENV, None)
    else:
        os.environ[RECORDER_ENV] = recorder
    root = tempfile.mkdtemp(prefix="dlog-paired-")
    nodes = {"off": _Node(root, None), "on": _Node(root, fmt)}
    try:
        for node in nodes.values():
            node.wait_ready()
        time.sleep(0.5)  # the writer child finishes starting
        for child in _children(nodes["on"].proc.pid):
            subprocess.run(["taskset", "-a", "-p", "-c", LOADGEN_CPU, str(child)], check=True,
                           stdout=subprocess.DEVNULL)
        warm = {name: node.load(1.0) for name, node in nodes.items()}  # imports, first segment: not counted
        rows: list[dict[str, dict[str, float]]] = []
        for i in range(pairs):
            row = {}
            for name in (("off", "on") if i % 2 == 0 else ("on", "off")):
                row[name] = nodes[name].load(duration, window)
            rows.append(row)
            print(f"  pair {i + 1}: ratio {row['on']['rate'] / row['off']['rate']:.3f}; "
                  + "; ".join(f"{side} {r['rate']:.0f} msg/s, CPU us/msg " + ", ".join(
                      f"{k.removeprefix('thread ')} {v / r['delivered'] * 1e6:.1f}" for k, v in sorted(r.items())
                      if k.startswith("thread ") and v > 0) for side, r in row.items()), flush=True)
    finally:
        for node in nodes.values():
            node.stop()
    on_delivered = warm["on"]["delivered"] + sum(r["on"]["delivered"] for r in rows)  # all the log holds
    log_bytes = _segment_bytes(nodes["on"].log_dir)
    shutil.rmtree(root)
    ratios = [r["on"]["rate"] / r["off"]["rate"] for r in rows]
    low, high = median_interval(ratios)

    def med(side: str, key: str, per_message: bool = False) -> float:
        return statistics.median(r[side][key] / (r[side]["delivered"] if per_message else 1) for r in rows)

    cpu = {side: (med(side, "cpu_broker", True) * 1e6, med(side, "cpu_tree", True) * 1e6) for side in nodes}
    return {
        "pairs": pairs, "duration_s": duration, "format": fmt, "window": window, "recorder": recorder,
        "rate_off_median": med("off", "rate"), "rate_on_median": med("on", "rate"),
        "pair_ratio_median": statistics.median(ratios), "pair_ratio_ci95": [low, high],
        "pair_ratio_mean": statistics.fmean(ratios), "pairs_at_or_above_target": sum(x >= TARGET for x in ratios),
        "ratio_of_median_rates": med("on", "rate") / med("off", "rate"),
        "cpu_us_per_msg": {"off_broker": cpu["off"][0], "on_broker": cpu["on"][0], "on_broker_and_child": cpu["on"][1]},
        "log_bytes_per_delivered_message": log_bytes / max(on_delivered, 1),
        "ratios": ratios, "rows": rows,
    }


def main() -> None:
    """Run and print the summary (and write it as JSON with --json)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of load per half-pair")
    ap.add_argument("--format", choices=["parquet", "jsonl.gz"], default="parquet")
    ap.add_argument("--window", type=int, default=64, help="unacked QoS1 PUBLISHes per publisher (10 publishers)")
    ap.add_argument("--recorder", choices=["auto", "native", "pure"], default="auto",
                    help="the on node's hot-event recorder: the C one (where built) or the Python lanes")
    ap.add_argument("--json", default="", metavar="FILE", help="also write the figures here")
    args = ap.parse_args()
    if args.pairs < 1 or args.duration <= 0 or args.window < 1:
        ap.error("--pairs and --window must be at least 1 and --duration positive")
    res = run(args.pairs, args.duration, args.format, args.window, args.recorder)
    low, high = res["pair_ratio_ci95"]
    cpu = res["cpu_us_per_msg"]
    print(f"[{res['pairs']} pairs of {res['duration_s']:g} s, window {res['window']}, {res['format']}, "
          f"{res['recorder']} recorder, writer child "
          f"on the load generator's core] median pair ratio {res['pair_ratio_median']:.3f} "
          f"(95 % interval {low:.3f}-{high:.3f}; mean "
          f"{res['pair_ratio_mean']:.3f}; {res['pairs_at_or_above_target']} of {res['pairs']} pairs >= {TARGET}); "
          f"median rates off {res['rate_off_median']:.0f}, on {res['rate_on_median']:.0f} msg/s; CPU us/message: "
          f"broker off {cpu['off_broker']:.1f}, on {cpu['on_broker']:.1f}, on with its writer child "
          f"{cpu['on_broker_and_child']:.1f}; log {res['log_bytes_per_delivered_message']:.1f} B per delivered message")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
