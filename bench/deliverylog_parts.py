"""Issue #5's logging cost taken apart, in one process: the QoS1 hot path with several event sinks, blocks interleaved.

Run: .venv/bin/python -m bench.deliverylog_parts [--sinks off,list,recorder,parquet] [--blocks 60] [--json F]
Each sink drives its own copy of bench.hotpath_bench's in-process broker (real ClientProtocol, Broker and SqliteStore
submits; no sockets, no SQL). The copies run in alternating blocks in one process pinned by the caller (taskset -c 0),
so a block and its neighbours share the machine's weather. Per sink: main-thread and other-thread (the log's drain)
CPU per message, and the median per-block difference from the first sink. Sinks:
  off           no event sink (logging off)
  null          the broker's calls into a Python no-op
  list          the DeliveryLog's pure-Python lanes, cleared at the end of each block: calls and queue, no drain
  recorder      the C recorder, cleared at the end of each block: calls and queue, no drain
  parquet       the full DeliveryLog (drain thread, writer child); parquet@S drains every S seconds
  parquet-pure  the same with the pure-Python lanes instead of the C recorder
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from appliance.server.node import GC_THRESHOLDS
from bench.hotpath_bench import _Bench, event_sink

SINKS = ("off", "null", "list", "recorder", "parquet", "parquet-pure")


def _sink(spec: str, directory: Path) -> Any:
    """The event sink of one variant (@S: a log's drain interval)."""
    name, _, interval = spec.partition("@")
    return event_sink(name, directory, float(interval or 0.05))


def _positive(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def run(sinks: list[str], blocks: int, block_rounds: int) -> dict[str, Any]:
    """Interleaved blocks of every sink; per sink the medians (µs per delivered message) as a dict."""
    for sink in sinks or [""]:
        name, at, interval = sink.partition("@")
        if name not in SINKS or (at and (not name.startswith("parquet") or not _positive(interval))):
            raise SystemExit(f"--sinks: a comma-separated choice of {', '.join(SINKS)} (parquet@S, parquet-pure@S: "
                             f"drained every S seconds), not {sink!r}")
    if len(set(sinks)) != len(sinks):
        raise SystemExit(f"--sinks: each sink once, not {','.join(sinks)}")
    if blocks < 1 or block_rounds < 1:
        raise SystemExit("--blocks and --block-rounds must be at least 1")
    main: dict[str, list[float]] = {s: [] for s in sinks}
    other: dict[str, list[float]] = {s: [] for s in sinks}
    with tempfile.TemporaryDirectory(prefix="dlog-parts-") as tmp:
        benches, logs = {}, {}
        try:
            for name in sinks:
                (Path(tmp) / name).mkdir()
                logs[name] = _sink(name, Path(tmp) / name)
                benches[name] = _Bench(Path(tmp) / name, logs[name])
                for k in range(50):
                    benches[name].round(k)
                if logs[name] is not None:
                    logs[name].flush()  # the writer child's start and first segment stay out of the blocks
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)  # as the node runs
            for block in range(blocks):
                for name in sinks if block % 2 == 0 else sinks[::-1]:
                    log = logs[name]
                    t0, p0, n = time.thread_time(), time.process_time(), 0
                    for k in range(block_rounds):
                        n += benches[name].round(k)
                    if log is not None:
                        log.flush()  # the drain of this block's events counts in this block
                    main_s = time.thread_time() - t0
                    main[name].append(main_s / n * 1e6)
                    other[name].append((time.process_time() - p0 - main_s) / n * 1e6)
        finally:
            for log in logs.values():
                if log is not None:
                    log.close()
    base = sinks[0]
    out: dict[str, Any] = {"blocks": blocks, "block_rounds": block_rounds, "baseline": base, "sinks": {}}
    for name in sinks:
        out["sinks"][name] = {
            "main_us": statistics.median(main[name]), "other_us": statistics.median(other[name]),
            "main_minus_baseline_us": statistics.median(a - b for a, b in zip(main[name], main[base], strict=True)),
            "total_minus_baseline_us": statistics.median(
                (a - b) + (c - d) for a, c, b, d in zip(main[name], other[name], main[base], other[base], strict=True)),
        }
    return out


def main() -> None:
    """Parse arguments, run, print one line per sink."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sinks", default="off,list,recorder,parquet")
    ap.add_argument("--blocks", type=int, default=60)
    ap.add_argument("--block-rounds", type=int, default=20)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    figures = run(args.sinks.split(","), args.blocks, args.block_rounds)
    for name, f in figures["sinks"].items():
        print(f"{name:8s} main {f['main_us']:6.2f} other {f['other_us']:5.2f} us/msg; minus {figures['baseline']} "
              f"per block: main {f['main_minus_baseline_us']:+.2f}, total {f['total_minus_baseline_us']:+.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
