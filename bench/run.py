"""Run every workload against every broker (alternated, repeated), print medians/ranges/ratios, write bench/out/."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.brokers import ALL, LOADGEN_CPU, REPO, Broker, pinned, pinning, store_figures, unavailable

OUT = REPO / "bench" / "out"
LOADGEN_TIMEOUT = 600.0


@dataclass(frozen=True)
class Workload:
    """A named workload: loadgen arguments (full and --quick) and the result keys shown in the table."""

    name: str
    title: str
    full: dict[str, Any]
    quick: dict[str, Any]
    metrics: tuple[tuple[str, str], ...]  # (result key, unit)
    brokers: tuple[str, ...] = ALL


WORKLOADS = {
    w.name: w
    for w in (
        Workload("qos0", "QoS0 fan-in, 10 publishers -> 1 subscriber, 100 B",
                 {"publishers": 10, "duration": 5}, {"publishers": 10, "duration": 0.5, "max_messages": 100_000},
                 (("delivered_rate", "msg/s"), ("lost", "msgs"), ("broker_drops", "msgs"))),
        Workload("qos1", "QoS1 pipelined, 10 publishers (window 64) -> 1 QoS1 subscriber",
                 {"publishers": 10, "duration": 5, "window": 64},
                 {"publishers": 10, "duration": 0.5, "window": 64, "max_messages": 50_000},
                 (("delivered_rate", "msg/s"), ("dropped", "msgs"), ("duplicates", "msgs"), ("broker_drops", "msgs"),
                  ("commit_batch_mean", "ops"), ("fsyncs_per_s", "1/s"))),
        Workload("latency", "QoS1 latency at 1500 msg/s, 50 publishers -> 1 subscriber",
                 {"publishers": 50, "rate": 1500, "duration": 10}, {"publishers": 50, "rate": 500, "duration": 1},
                 (("p50_ms", "ms"), ("p99_ms", "ms"), ("max_ms", "ms"), ("lost", "msgs"))),
        Workload("rss", "RSS with idle persistent sessions (clean_session=0, 1 subscription each)",
                 {"sessions": 5000, "duration": 180}, {"sessions": 200, "duration": 30},
                 (("per_conn_kb", "KiB"), ("rss_total_mb", "MiB"), ("sessions", "conns"))),
        Workload("restart", "Restart with queued QoS1 messages: start -> first queued message delivered",
                 {"messages": 100_000, "publishers": 10, "window": 64, "duration": 120},
                 {"messages": 2_000, "publishers": 10, "window": 64, "duration": 30},
                 (("first_delivery_s", "s"), ("all_delivered_s", "s"), ("delivered", "msgs"), ("lost", "msgs")),
                 brokers=("ours", "mosquitto", "mosquitto-nodrop")),  # amqtt keeps no sessions across restarts
    )
}


def loadgen(workload: str, port: int, params: dict[str, Any], broker_pid: int = 0) -> subprocess.Popen[str]:
    """Start the load generator (pinned to its own core) for one workload."""
    argv = [sys.executable, "-m", "bench.loadgen", workload, "--port", str(port), "--broker-pid", str(broker_pid)]
    for k, v in params.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(pinned(LOADGEN_CPU, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)


def collect(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The load generator's JSON result, or an error record."""
    try:
        out, err = proc.communicate(timeout=LOADGEN_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"error": f"load generator exceeded {LOADGEN_TIMEOUT} s"}
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"error": f"load generator exit {proc.returncode}: {err.strip()[-500:]}"}
    return dict(json.loads(lines[-1]))


def measure(workload: Workload, name: str, params: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One broker, one round: start it, run the workload, stop it."""
    broker = Broker(name, tmp, persistent=workload.name == "restart")
    broker.start()
    try:
        if workload.name == "restart":
            return restart(broker, params)
        before = broker.scrape()
        t0 = time.monotonic()
        result = collect(loadgen(workload.name, broker.port, params, broker.pid))
        result |= store_figures(before, broker.scrape(), time.monotonic() - t0)
        if broker.proc is not None and broker.proc.poll() is not None:
            result["error"] = f"broker died: {broker.log_tail()}"
        return result
    finally:
        broker.stop()


def restart(broker: Broker, params: dict[str, Any]) -> dict[str, Any]:
    """Queue messages, stop the broker, start it again and time the first (and last) queued delivery."""
    fill = collect(loadgen("restart-fill", broker.port, params))
    broker.stop()
    drain = loadgen("restart-drain", broker.port, params)
    time.sleep(0.2)  # let the drainer begin polling
    broker.spawn()
    result = fill | collect(drain)
    if "delivered" in result and "queued_acked" in result:
        result["lost"] = result["queued_acked"] - result["delivered"]
    if result.get("first_at"):
        result["first_delivery_s"] = result["first_at"] - broker.started_at
        result["all_delivered_s"] = result["last_at"] - broker.started_at
    return result


def summarize(rows: list[dict[str, Any]], workload: Workload) -> list[dict[str, Any]]:
    """Per broker and metric: median, min, max over rounds, and ratios of medians vs both mosquitto configs."""
    medians: dict[tuple[str, str], float] = {}
    table = []
    for key, unit in workload.metrics:
        for name in workload.brokers:
            vals = [r[key] for r in rows if r["broker"] == name and isinstance(r.get(key), int | float)]
            if not vals:
                continue
            med = statistics.median(vals)
            medians[(name, key)] = med
            table.append({"workload": workload.name, "broker": name, "metric": key, "unit": unit, "median": med,
                          "min": min(vals), "max": max(vals), "rounds": len(vals)})
    for row in table:
        for base in ("mosquitto", "mosquitto-nodrop"):
            b = medians.get((base, row["metric"]))
            row[f"vs_{base}"] = row["median"] / b if b else None
    return table


def fmt(v: float | None) -> str:
    """Compact number for the table."""
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def print_table(table: list[dict[str, Any]], write: Callable[[str], object] = print) -> None:
    """The results table: medians, ranges, ratios."""
    head = f"{'workload':9} {'metric':24} {'broker':17} {'median':>10} {'range':>21} {'vs mosq':>8} {'vs nodrop':>9}"
    write(head)
    write("-" * len(head))
    for r in table:
        rng = f"{fmt(r['min'])}..{fmt(r['max'])}"
        write(f"{r['workload']:9} {r['metric'] + ' (' + r['unit'] + ')':24} {r['broker']:17} {fmt(r['median']):>10} "
              f"{rng:>21} {fmt(r['vs_mosquitto']):>8} {fmt(r['vs_mosquitto-nodrop']):>9}")


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m bench.run [--only qos0,latency] [--brokers ours,mosquitto] [--rounds N] [--quick]."""
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("--only", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    p.add_argument("--brokers", default=",".join(ALL), help=f"comma list of {', '.join(ALL)}")
    p.add_argument("--rounds", type=int, default=None, help="repetitions (default 3, or 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny workloads: a smoke test of the harness, not numbers")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    wanted = [w.strip() for w in a.only.split(",") if w.strip()]
    bad = [w for w in wanted if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workload(s): {', '.join(bad)}")
    rounds = a.rounds or (1 if a.quick else 3)
    brokers = []
    for name in (b.strip() for b in a.brokers.split(",") if b.strip()):
        if name not in ALL:
            p.error(f"unknown broker {name!r}")
        why = unavailable(name)
        if why:
            print(f"# skipping {name}: {why}", file=sys.stderr)
        else:
            brokers.append(name)
    if not brokers:
        print("no broker available", file=sys.stderr)
        return 2
    if not pinning():
        print("# fewer than 2 CPUs (or no taskset): broker and load generator are NOT pinned", file=sys.stderr)
    a.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    full_table: list[dict[str, Any]] = []
    for wname in wanted:
        w = WORKLOADS[wname]
        params = w.quick if a.quick else w.full
        rows: list[dict[str, Any]] = []
        names = [b for b in brokers if b in w.brokers]
        for rnd in range(rounds):
            order = names[rnd % len(names):] + names[: rnd % len(names)] if names else []  # alternate who goes first
            for name in order:
                with tempfile.TemporaryDirectory(prefix=f"bench-{wname}-{name}-") as tmp:
                    try:
                        res = measure(w, name, params, Path(tmp))
                    except RuntimeError as exc:
                        res = {"error": str(exc)}
                res |= {"broker": name, "round": rnd}
                rows.append(res)
                if "error" in res:
                    print(f"# {wname}/{name} round {rnd}: {res['error']}", file=sys.stderr)
        table = summarize(rows, w)
        full_table += table
        (a.out / f"{wname}-{stamp}.json").write_text(json.dumps(
            {"workload": wname, "title": w.title, "quick": a.quick, "params": params, "rounds": rounds,
             "pinned": pinning(), "raw": rows, "summary": table}, indent=1))
    print_table(full_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
