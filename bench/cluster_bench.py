"""Cluster benchmark: nodes on loopback (real `appliance run` processes, peer links over 127.0.0.1, fsync on).

Seed workload: 50 publishers on node 1 -> 1 persistent QoS1 subscriber on node 2, paced at 1500 msg/s, 100-byte
payloads: delivery latency (send -> subscriber) and PUBACK latency (send -> PUBACK, which waits for the local commit,
the receiving node's durable enqueue and, with R=2, the replica's commit) at p50/p95/p99/max. Throughput: pipelined
QoS1 cross-node vs single-node (ratio), and R=2 vs R=1 (issue 4's ratio).

    .venv/bin/python -m bench.cluster_bench [--seconds 10] [--append bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import wire
from bench.loadgen import Conn, Sink, connect, subscribe

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Nodes:
    """N broker nodes on loopback; clustered when n > 1 (seeds, no mDNS)."""

    def __init__(self, n: int, r: int, workdir: Path) -> None:
        self.n, self.r, self.workdir = n, r, workdir
        self.mqtt = [_free_port() for _ in range(n)]
        self.cport = [_free_port() for _ in range(n)]
        self.http = [_free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Nodes:
        for i in range(self.n):
            conf = self.workdir / f"n{i}.toml"
            lines = ["[node]", f'name = "n{i}"', f'data_dir = "{self.workdir / f"n{i}"}"', "[listener]",
                     f'tcp = "127.0.0.1:{self.mqtt[i]}"', "[metrics]", "sys_interval = 0",
                     f'http = "127.0.0.1:{self.http[i]}"']
            if self.n > 1:
                seeds = [f"127.0.0.1:{p}" for j, p in enumerate(self.cport) if j != i]
                lines += ["[cluster]", "enabled = true", 'name = "bench"', 'secret = "bench"',
                          f'bind = "127.0.0.1:{self.cport[i]}"', f"seeds = {json.dumps(seeds)}", "mdns = false",
                          f"replication_factor = {self.r}", "heartbeat_interval = 0.5", "failure_timeout = 3.0"]
            conf.write_text("\n".join(lines) + "\n")
            log = (self.workdir / f"n{i}.log").open("ab")
            self.procs.append(subprocess.Popen([sys.executable, "-m", "appliance.cli", "run", "--config", str(conf),
                                                "--log-level", "WARNING"], stdout=log, stderr=subprocess.STDOUT,
                                               cwd=REPO, start_new_session=True))
        for port in self.mqtt:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node on {port} did not start")
                time.sleep(0.05)
        deadline = time.monotonic() + 60
        while self.n > 1 and not all(self.linked(i) for i in range(self.n)):
            if time.monotonic() > deadline:
                raise RuntimeError("nodes did not form a cluster")
            time.sleep(0.2)
        return self

    def linked(self, i: int) -> bool:
        """Whether node i sees every other node running."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http[i]}/cluster", timeout=5) as resp:
                members = json.loads(resp.read())["members"]
        except (OSError, ValueError, KeyError):
            return False
        return sum(1 for m in members if m["state"] == "running") == self.n - 1

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(p * len(values)))], 3) if values else float("nan")


async def latency(pub_port: int, sub_port: int, publishers: int, rate: float, seconds: float,
                  size: int) -> dict[str, Any]:
    """Paced QoS1: delivery latency at the subscriber and PUBACK latency at the publishers."""
    sub = await connect(sub_port, "cb-lat-sub", clean=False)
    await subscribe(sub, "cb/lat/#", 1)
    await asyncio.sleep(1.0)  # the subscription reaches node 1
    sink, stop = Sink(sub, latency=True), asyncio.Event()
    sink_task = asyncio.create_task(sink.run(stop))
    pubs = [await connect(pub_port, f"cb-lat-pub{i}") for i in range(publishers)]
    sent_at: dict[tuple[int, int], int] = {}
    ack_ms: list[float] = []

    async def acks(i: int, conn: Conn) -> None:
        while not stop.is_set():
            try:
                pkts = await conn.packets(0.2)
            except TimeoutError:
                continue
            if not pkts:
                return
            now = time.monotonic_ns()
            for first, body in pkts:
                if first >> 4 == wire.PUBACK:
                    pid = struct.unpack_from("!H", body)[0]
                    t = sent_at.pop((i, pid), None)
                    if t is not None:
                        ack_ms.append((now - t) / 1e6)

    ack_tasks = [asyncio.create_task(acks(i, c)) for i, c in enumerate(pubs)]
    heads = [wire.publish_template(f"cb/lat/{i:02d}", size)[0] for i in range(publishers)]
    pad = b"x" * (size - 8)
    total = int(rate * seconds)
    t0 = time.monotonic()
    for k in range(total):
        delay = t0 + k / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        i = k % publishers
        pid = (k // publishers) % 65535 + 1
        now = time.monotonic_ns()
        sent_at[(i, pid)] = now
        pubs[i].writer.write(heads[i] + struct.pack("!HQ", pid, now) + pad)
    offered = total / (time.monotonic() - t0)
    await sink.drain(total, stop)
    await sink_task
    await asyncio.gather(*ack_tasks)
    for c in (*pubs, sub):
        c.close()
    lat = [ns / 1e6 for ns in sink.lat_ns]
    return {"published": total, "delivered": sink.count, "offered_rate": round(offered, 1),
            "p50_ms": _pct(lat, 0.5), "p95_ms": _pct(lat, 0.95), "p99_ms": _pct(lat, 0.99),
            "max_ms": round(max(lat), 3) if lat else None,
            "ack_p50_ms": _pct(ack_ms, 0.5), "ack_p99_ms": _pct(ack_ms, 0.99),
            "ack_max_ms": round(max(ack_ms), 3) if ack_ms else None}


async def throughput(pub_port: int, sub_port: int, publishers: int, seconds: float, size: int,
                     window: int = 20) -> dict[str, Any]:
    """Pipelined QoS1 (a window of unacked publishes per publisher) to one persistent subscriber."""
    sub = await connect(sub_port, "cb-tp-sub", clean=False)
    await subscribe(sub, "cb/tp/#", 1)
    await asyncio.sleep(1.0)
    sink, stop = Sink(sub, latency=True), asyncio.Event()
    sink_task = asyncio.create_task(sink.run(stop))
    pubs = [await connect(pub_port, f"cb-tp-pub{i}") for i in range(publishers)]
    acked = [0] * publishers
    t0 = time.monotonic()
    end = t0 + seconds

    async def pipeline(i: int, conn: Conn) -> None:
        head = wire.publish_template(f"cb/tp/{i:02d}", size)[0]
        pad = b"x" * (size - 8)
        seq = 0

        def burst(n: int) -> bytes:
            nonlocal seq
            out = []
            for _ in range(n):
                seq += 1
                out.append(head + struct.pack("!HQ", seq % 65535 + 1, time.monotonic_ns()) + pad)
            return b"".join(out)

        conn.writer.write(burst(window))
        inflight = window
        while inflight:
            try:
                pkts = await conn.packets(20)
            except TimeoutError:
                break
            if not pkts:
                break
            n = sum(1 for f, _ in pkts if f >> 4 == wire.PUBACK)
            inflight -= n
            acked[i] += n
            if n and time.monotonic() < end:
                conn.writer.write(burst(n))
                inflight += n

    await asyncio.gather(*(pipeline(i, c) for i, c in enumerate(pubs)))
    t_pub = time.monotonic() - t0
    await sink.drain(sum(acked), stop)
    await sink_task
    for c in (*pubs, sub):
        c.close()
    lat = [ns / 1e6 for ns in sink.lat_ns]
    return {"acked": sum(acked), "delivered": sink.count, "acked_rate": round(sum(acked) / t_pub, 1),
            "p99_ms": _pct(lat, 0.99)}


async def window(nodes: Nodes, kill: int, sig: int = signal.SIGKILL, rate: float = 200.0,
                 seconds: float = 12.0) -> dict[str, Any]:
    """Window of uncertainty: paced QoS1 publishes on node 0 to a persistent subscriber owned by node `kill`;
    SIGKILL (connections reset at once) or SIGSTOP (silence until failure_timeout) it a third of the way in;
    report the longest PUBACK wait and how many acks were held."""
    sub = await connect(nodes.mqtt[kill], "cb-win-sub", clean=False)
    await subscribe(sub, "cb/win/#", 1)
    await asyncio.sleep(1.0)
    pub = await connect(nodes.mqtt[0], "cb-win-pub")
    sent_at: dict[int, int] = {}
    acks: list[tuple[float, float]] = []  # (send time s, ack wait ms)
    stop = asyncio.Event()

    async def read_acks() -> None:
        while not stop.is_set():
            try:
                pkts = await pub.packets(0.2)
            except TimeoutError:
                continue
            if not pkts:
                return
            now = time.monotonic_ns()
            for first, body in pkts:
                if first >> 4 == wire.PUBACK:
                    t = sent_at.pop(struct.unpack_from("!H", body)[0], None)
                    if t is not None:
                        acks.append((t / 1e9, (now - t) / 1e6))

    reader = asyncio.create_task(read_acks())
    head = wire.publish_template("cb/win/x", 100)[0]
    pad = b"x" * 92
    total = int(rate * seconds)
    t0 = time.monotonic()
    killed_at = 0.0
    for k in range(total):
        delay = t0 + k / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if k == total // 3:
            nodes.procs[kill].send_signal(sig)
            killed_at = time.monotonic()
        pid = k % 65535 + 1
        sent_at[pid] = time.monotonic_ns()
        pub.writer.write(head + struct.pack("!HQ", pid, sent_at[pid]) + pad)
    await asyncio.sleep(3.0)
    stop.set()
    await reader
    pub.close()
    if sig == signal.SIGSTOP:
        nodes.procs[kill].send_signal(signal.SIGCONT)
    held = [ms for t, ms in acks if t >= killed_at - 1]
    return {"published": total, "acked": len(acks), "max_ack_wait_ms": round(max(ms for _, ms in acks), 1),
            "acks_held_over_100ms": sum(1 for ms in held if ms > 100),
            "failure_timeout_s": 3.0}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement, each on fresh nodes."""
    out: dict[str, Any] = {"load_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
        def fresh(name: str, n: int, r: int) -> Nodes:
            d = Path(tmp) / name
            d.mkdir()
            return Nodes(n, r, d)

        with fresh("lat-r2", 2, 2) as nodes:
            out["latency_r2"] = asyncio.run(latency(nodes.mqtt[0], nodes.mqtt[1], 50, args.rate, args.seconds, 100))
        with fresh("lat-r1", 2, 1) as nodes:
            out["latency_r1"] = asyncio.run(latency(nodes.mqtt[0], nodes.mqtt[1], 50, args.rate, args.seconds, 100))
        with fresh("tp-single", 1, 1) as nodes:
            out["tp_single"] = asyncio.run(throughput(nodes.mqtt[0], nodes.mqtt[0], 50, args.seconds, 100))
        pairs = []
        for i in range(args.tp_rounds):  # R=1 and R=2 alternate: a shared machine's load drifts between runs
            loads = [os.getloadavg()[0]]
            with fresh(f"tp-r1-{i}", 2, 1) as nodes:
                r1 = asyncio.run(throughput(nodes.mqtt[0], nodes.mqtt[1], 50, args.seconds, 100))
            with fresh(f"tp-r2-{i}", 2, 2) as nodes:
                r2 = asyncio.run(throughput(nodes.mqtt[0], nodes.mqtt[1], 50, args.seconds, 100))
            loads.append(os.getloadavg()[0])
            pairs.append({"r1": r1, "r2": r2, "ratio": round(r2["acked_rate"] / (r1["acked_rate"] or 1), 3),
                          "load": [round(x, 2) for x in loads]})
        out["tp_pairs"] = pairs
        median = sorted(pairs, key=lambda p: p["ratio"])[len(pairs) // 2]
        out["tp_cross_r1"], out["tp_cross_r2"] = median["r1"], median["r2"]
        with fresh("window-kill", 3, 2) as nodes:
            out["window_kill"] = asyncio.run(window(nodes, 1, signal.SIGKILL))
        with fresh("window-stop", 3, 2) as nodes:
            out["window_stop"] = asyncio.run(window(nodes, 1, signal.SIGSTOP))
    single = out["tp_single"]["acked_rate"] or 1
    out["ratio_cross_vs_single"] = round(out["tp_cross_r1"]["acked_rate"] / single, 3)
    out["ratio_r2_vs_r1"] = round(out["tp_cross_r2"]["acked_rate"] / (out["tp_cross_r1"]["acked_rate"] or 1), 3)
    out["load_end"] = round(os.getloadavg()[0], 2)
    return out


def markdown(res: dict[str, Any], args: argparse.Namespace) -> str:
    """A RESULTS.md section."""
    lr2, lr1 = res["latency_r2"], res["latency_r1"]
    rows = [
        f"\n## Cluster (bench/cluster_bench.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
        f"Two `appliance run` nodes on loopback, fsync on, inter-node acks on; {platform.machine()}, "
        f"{args.seconds:.0f} s per run; shared 2-core machine, 1-minute load average {res['load_start']} at the "
        f"start, {res['load_end']} at the end.\n",
        "| seed workload: 50 pubs on node 1 -> 1 sub on node 2, QoS1, 100 B | delivered | offered msg/s | "
        "p50 ms | p95 ms | p99 ms | max ms | PUBACK p50 / p99 / max ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in (("R=2 (queue replicated on node 1)", lr2), ("R=1", lr1)):
        rows.append(f"| {name} | {r['delivered']}/{r['published']} | {r['offered_rate']} | {r['p50_ms']} | "
                    f"{r['p95_ms']} | {r['p99_ms']} | {r['max_ms']} | {r['ack_p50_ms']} / {r['ack_p99_ms']} / "
                    f"{r['ack_max_ms']} |")
    rows += [
        "",
        "| pipelined QoS1 throughput (50 pubs, window 20) | acked msg/s | delivered | delivery p99 ms |",
        "| --- | --- | --- | --- |",
    ]
    for name, key in (("single node", "tp_single"), ("cross-node R=1", "tp_cross_r1"),
                      ("cross-node R=2", "tp_cross_r2")):
        r = res[key]
        rows.append(f"| {name} | {r['acked_rate']} | {r['delivered']}/{r['acked']} | {r['p99_ms']} |")
    if len(res["tp_pairs"]) > 1:
        rows.append("\nR=2 / R=1 pairs, back to back (R=1 acked msg/s, R=2 acked msg/s, ratio, load before / after): "
                    + "; ".join(f"{p['r1']['acked_rate']}, {p['r2']['acked_rate']}, **{p['ratio']}x**, "
                                f"{p['load'][0]} / {p['load'][1]}" for p in res["tp_pairs"])
                    + " (the table shows the median pair).")
    for how, key in (("SIGKILLed", "window_kill"), ("SIGSTOPped", "window_stop")):
        w = res[key]
        rows.append(f"\nWindow of uncertainty (3 nodes, R=2, 200 msg/s QoS1 from node 0 to a subscriber owned by "
                    f"node 1, node 1 {how}, failure_timeout {w['failure_timeout_s']} s): {w['acked']}/{w['published']} "
                    f"acknowledged, longest PUBACK wait {w['max_ack_wait_ms']} ms, {w['acks_held_over_100ms']} acks "
                    "held > 100 ms (held, then released with the copies in node 0's durable in-transit buffer).")
    rows.append(f"\nCross-node / single-node QoS1 throughput: **{res['ratio_cross_vs_single']}x**; "
                f"R=2 / R=1: **{res['ratio_r2_vs_r1']}x** (target >= 0.6x). "
                f"Seed-workload p99: R=2 {lr2['p99_ms']} ms, R=1 {lr1['p99_ms']} ms (targets 15 / 10 ms), "
                f"max {lr2['max_ms']} / {lr1['max_ms']} ms (target 30 ms).\n")
    return "\n".join(rows)


def main() -> int:
    """Run, print JSON, optionally append the markdown table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=1500.0)
    ap.add_argument("--tp-rounds", type=int, default=1, help="R=1 / R=2 throughput pairs (median reported)")
    ap.add_argument("--append", type=Path, help="append a results section to this markdown file")
    args = ap.parse_args()
    res = run(args)
    print(json.dumps(res, indent=2))
    if args.append:
        with args.append.open("a") as f:
            f.write(markdown(res, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
