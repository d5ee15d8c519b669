"""Delivery-log costs: emit() ns, writer µs/event, compressed bytes per delivered message, and a QoS1 loop ratio.

Run: .venv/bin/python -m bench.deliverylog_bench [--messages N] [--format parquet|jsonl.gz|both]
     .venv/bin/python -m bench.deliverylog_bench --broker-rounds 3 [--format ...]   (our broker, logging on vs off)
The loop ratio drives the protocol codec for one QoS1 publish -> deliver -> ack per message (a lower bound on the
broker's real per-message work, so the ratio here is pessimistic). The broker rounds report the delivered rate (wall
time) and, because a shared machine makes wall time noisy, CPU seconds per delivered message of the broker process and
of the broker plus its writer child (both pinned to the broker core), each as an on/off ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

from appliance.broker.ports import NullEventSink
from appliance.deliverylog import DeliveryLog
from appliance.deliverylog.identity import Identity
from appliance.deliverylog.writer import Limits, SegmentWriter
from appliance.protocol.codec import encode_publish
from appliance.protocol.decoder import Decoder

BOOT = "0b7c3a5e-9d1f-4c2a-8e6b-5f4d3c2b1a09"
FORMATS = ("parquet", "jsonl.gz")


FLUSH_ENV = "BENCH_DLOG_FLUSH_S"  # the drain interval handed to the broker rounds' servers
RECORDER_ENV = "BENCH_DLOG_RECORDER"  # native | pure: the hot events' recorder of the servers' logs (default: auto)


def _segment_bytes(directory: str) -> int:
    """Bytes of closed and open segments (journal and any Parquet tmp) in `directory`."""
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if n.endswith((".jsonl.gz", ".parquet", ".part", ".tmp")))


def _message_events(sink, i: int, pub_pid: int) -> None:
    """The events the broker emits for one QoS1 message from one publisher to one subscriber."""
    msg_id = f"node-a:{i}"
    sink.emit(
        "received", msg_id=msg_id, publisher="sensor-17", publisher_packet_id=pub_pid, publisher_seq=i,
        topic="plant/line3/sensor-17/temp", qos=1, retain=False, payload_size=64,
    )
    sink.emit("committed", msg_id=msg_id)
    sink.emit("routed", msg_id=msg_id, subscriber="historian", filter="plant/+/+/temp", qos=1)
    sink.emit("delivered", msg_id=msg_id, subscriber="historian", dup=False, attempt=1)
    sink.emit("acked", msg_id=msg_id, subscriber="historian")


def _broker_events(sink, messages: list) -> None:
    """What our broker emits for QoS1 messages from one publisher to one online persistent subscriber (its calls)."""
    routed, delivered = sink.record_routed, sink.record_delivered
    committed, acked = sink.record_committed, sink.record_acked
    received = sink.record_received
    for i, m in enumerate(messages):
        received(m.msg_id, m.publisher, m.topic, m.qos, m.retain, len(m.payload), m.properties.user_properties or None,
                 i % 65535 + 1)
        routed(m.msg_id, "historian", "plant/+/+/temp", 1)
        delivered(m.msg_id, "historian", 1, False, 1)
        committed(m.msg_id)
        acked(m.msg_id, "historian", 1)


def side_cost(n: int, process: bool, fmt: str) -> tuple[float, float, float]:
    """(µs of broker-process CPU per message, µs of writer-child CPU per message, log B per message)."""
    import resource

    from appliance.broker.model import Message
    from appliance.protocol.packets import Properties

    messages = [
        Message(f"node-a:{i}", "plant/line3/sensor-17/temp", b"x" * 64, 1, False, "sensor-17", time.time(),
                properties=Properties(user_properties=[("seq", str(i))]))
        for i in range(n)
    ]
    d = tempfile.mkdtemp()
    try:
        child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        log = DeliveryLog(d, fleet="fleet-eu", device="pi-0042", node="node-a", firmware="1.4.2", boot_id=BOOT,
                          clock_synced=True, process=process, format=fmt)
        t0 = time.process_time()
        _broker_events(log, messages)
        log.flush()
        parent = time.process_time() - t0
        log.close()
        child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        child = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
        return parent / n * 1e6, child / n * 1e6, _segment_bytes(d) / n
    finally:
        shutil.rmtree(d)


def null_cost(n: int) -> float:
    """µs per message of the same emit calls into NullEventSink (the floor)."""
    from appliance.broker.model import Message

    messages = [Message(f"node-a:{i}", "t", b"", 1, False, "p", 0.0) for i in range(n)]
    t0 = time.process_time()
    _broker_events(NullEventSink(), messages)
    return (time.process_time() - t0) / n * 1e6


class _Collect:
    """Collects items the way DeliveryLog.emit does, without a writer thread."""

    def __init__(self) -> None:
        self.items: list = []

    def emit(self, kind, **fields) -> None:
        self.items.append((kind, time.time_ns(), time.monotonic_ns(), fields))


def writer_cost(messages: int, level: int, rate_per_s: float, fmt: str) -> tuple[float, float]:
    """(µs of writer CPU per event, compressed bytes per message) for `messages` messages at `rate_per_s`."""
    c = _Collect()
    for i in range(messages):
        _message_events(c, i, i % 65535 + 1)
    start_wall, start_mono = time.time_ns(), time.monotonic_ns()
    step = int(1e9 / rate_per_s / 5)
    c.items = [(k, start_wall + j * step, start_mono + j * step, f) for j, (k, _, _, f) in enumerate(c.items)]
    d = tempfile.mkdtemp()
    try:
        ident = Identity("fleet-eu", "pi-0042", "node-a", "1.4.2", BOOT)
        w = SegmentWriter(d, ident, Limits(level=level, format=fmt), lambda: True)
        batch = max(1, int(rate_per_s * 5 * 0.5))  # one writer pass per 0.5 s
        t0 = time.process_time_ns()
        for s in range(0, len(c.items), batch):
            w.write(c.items[s : s + batch])
        w.close()
        cpu = time.process_time_ns() - t0
        return cpu / len(c.items) / 1000, _segment_bytes(d) / messages
    finally:
        shutil.rmtree(d)


def qos1_loop(sink, messages: int) -> float:
    """Messages/s through a codec-only QoS1 publish -> deliver -> puback loop reporting to `sink`."""
    inbound = Decoder(protocol_version=5)
    outbound = Decoder(protocol_version=5)
    payload = b"x" * 64
    t0 = time.perf_counter()
    for i in range(messages):
        pid = i % 65535 + 1
        wire = encode_publish("plant/line3/sensor-17/temp", payload, qos=1, packet_id=pid)
        (pub,) = inbound.feed(wire)
        out = encode_publish(pub.topic, pub.payload, qos=1, packet_id=pid)
        outbound.feed(out)
        _message_events(sink, i, pid)
    return messages / (time.perf_counter() - t0)


async def _serve(listen: str, data_dir: str, log_dir: str, mode: str = "process", fmt: str = "parquet") -> int:
    """Run our broker node with [deliverylog] enabled when log_dir is set (mode: writer process or thread)."""
    import functools
    import gc
    import json

    from appliance.server import node as node_module
    from appliance.server.config import load

    overrides: dict = {"node": {"data_dir": data_dir}, "listener": {"tcp": listen}}
    if log_dir:
        overrides["deliverylog"] = {"enabled": True, "dir": log_dir, "format": fmt}
        extra: dict = {"flush_interval_s": float(os.environ[FLUSH_ENV])} if os.environ.get(FLUSH_ENV) else {}
        recorder = os.environ.get(RECORDER_ENV, "")
        if recorder:
            extra["native"] = recorder == "native"
        node_module.DeliveryLog = functools.partial(  # type: ignore[misc]
            DeliveryLog, process=mode == "process", **extra)
    node = node_module.Node(load(None, overrides))
    await node.async_start()
    import threading

    with open(os.path.join(data_dir, "threads.json"), "w") as f:  # thread names by native id, for per-thread CPU
        json.dump({str(t.native_id): t.name for t in threading.enumerate()}, f)
    stats_path = os.path.join(data_dir, "gc.json")  # the round reads it after the broker exits
    log: list[tuple[float, int, float]] = []  # (wall time at its start, generation, thread CPU s) per collection
    started = [0.0, 0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0], started[1] = time.time(), time.thread_time()
        else:
            log.append((started[0], info["generation"], time.thread_time() - started[1]))

    gc.callbacks.append(on_gc)
    try:
        return await node.async_run_until_stopped()
    finally:
        gc.callbacks.remove(on_gc)
        with open(stats_path, "w") as f:
            json.dump(log, f)


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(CPU seconds of process `pid`, CPU seconds of it and all its live descendants), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(p: int) -> float:
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def tree(p: int) -> float:
        total = own(p)
        for task in os.listdir(f"/proc/{p}/task"):
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    total += sum(tree(int(c)) for c in f.read().split())
            except (FileNotFoundError, ProcessLookupError):
                pass
        return total

    return own(pid), tree(pid)


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of process `pid`, by native thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(task)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _children(pid: int) -> list[int]:
    """Child process ids of every thread of `pid`."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def _spy_summary(path: str) -> str:
    """Share of py-spy samples (collapsed stacks) in delivery-log frames: emit calls and the drain thread."""
    total = emit = drain = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            n = int(count)
            total += n
            if "_run (appliance/deliverylog/sink.py" in stack:
                drain += n
            elif "appliance/deliverylog/" in stack:
                emit += n
    share = {name: f"{100 * x / max(total, 1):.1f} %" for name, x in (("emit", emit), ("drain", drain))}
    return f"{total} GIL samples: emit calls {share['emit']}, drain thread {share['drain']}"


def _spy(pid: int, duration: float, out: str) -> Any:
    """Start py-spy sampling `pid` (GIL holders only, not pausing it) into `out` (collapsed stacks)."""
    import subprocess
    import sys

    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(max(1, int(duration) - 1)),
                             "--rate", "200", "--gil", "--nonblocking", "--format", "raw", "--output", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _broker_round(logging_on: bool, duration: float, mode: str, fmt: str,
                  writer_cpu: str = "broker", spy_out: str = "",
                  writer_nice: int | None = None, paced_rate: float = 0.0) -> tuple[float, int, int, float, float]:
    """One qos1 loadgen run against a fresh broker (pipelined, or paced at `paced_rate` msg/s when given).

    Returns (delivered msg/s, delivered, log bytes, broker CPU s, broker + writer child CPU s) with CPU counted
    from just before the load to just after it (start-up and shutdown excluded). With `spy_out`, py-spy samples
    the broker during the load into that file.
    """
    import json
    import resource
    import signal
    import socket
    import subprocess
    import sys

    from bench.brokers import BROKER_CPU, LOADGEN_CPU, pinned

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp()
    log_dir = os.path.join(tmp, "deliverylog") if logging_on else ""
    argv = [sys.executable, "-m", "bench.deliverylog_bench", "serve", f"127.0.0.1:{port}", os.path.join(tmp, "data"),
            log_dir, mode, fmt]
    broker = subprocess.Popen(pinned(BROKER_CPU, argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or broker.poll() is not None:
                    raise RuntimeError("broker did not start") from None
                time.sleep(0.05)
        time.sleep(0.5)  # let the writer child finish starting
        if writer_cpu == "other":  # as on a multi-core device: the writer child is not confined to the broker's core
            for child in _children(broker.pid):
                subprocess.run(["taskset", "-a", "-p", "-c", LOADGEN_CPU, str(child)], check=True,
                               stdout=subprocess.DEVNULL)
        if writer_nice is not None:  # the child runs at nice 10 (child.NICE); on a box shared with other jobs that
            for child in _children(broker.pid):  # starves it where a Pi's spare core would not
                os.setpriority(os.PRIO_PROCESS, child, writer_nice)
        threads0 = _thread_cpu(broker.pid)
        cpu0 = _cpu_seconds(broker.pid)
        t0 = time.time()
        spy = _spy(broker.pid, duration, spy_out) if spy_out else None
        usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = (["latency", "--rate", str(paced_rate)] if paced_rate else ["qos1", "--max-messages", "2000000"])
        out = subprocess.run(pinned(LOADGEN_CPU, [sys.executable, "-m", "bench.loadgen", *load, "--port", str(port),
                                                  "--duration", str(duration)]),
                             capture_output=True, text=True, timeout=600, check=True).stdout
        usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        loadgen_cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
        cpu1 = _cpu_seconds(broker.pid)
        t1 = time.time()
        threads1 = _thread_cpu(broker.pid)
        if spy is not None:
            spy.wait(60)
            print(f"  py-spy ({'on' if logging_on else 'off'}): {_spy_summary(spy_out)}", flush=True)
        result = json.loads(out.strip().splitlines()[-1])
        if paced_rate:  # the latency workload reports what it offered; the rate here is what was delivered
            result["delivered_rate"] = result["delivered"] / duration
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(60)
    try:
        with open(os.path.join(tmp, "data", "gc.json")) as f:
            gcs = json.load(f)
        window = [(gen, cpu) for t, gen, cpu in gcs if t0 <= t <= t1]  # the load window only
        counts = [sum(1 for g, _ in window if g == gen) for gen in range(3)]
        us = [sum(c for g, c in window if g == gen) / max(result["delivered"], 1) * 1e6 for gen in range(3)]
        print(f"  broker gc ({'on' if logging_on else 'off'}), load window: collections by generation {counts}, "
              f"CPU {sum(us):.2f} us/msg {[round(x, 2) for x in us]}", flush=True)
    except (OSError, ValueError, KeyError):
        pass
    try:
        with open(os.path.join(tmp, "data", "threads.json")) as f:
            names = {int(k): v for k, v in json.load(f).items()}
    except (OSError, ValueError):
        names = {}
    per_thread: dict[str, float] = {}
    for tid, cpu in threads1.items():
        name = "main" if tid == broker.pid else names.get(tid, "other")
        per_thread[name] = per_thread.get(name, 0.0) + cpu - threads0.get(tid, 0.0)
    delivered_n = max(result["delivered"], 1)
    print(f"  broker threads ({'on' if logging_on else 'off'}), CPU us/msg: "
          f"[{result['delivered_rate']:.0f} msg/s; load generator {loadgen_cpu / delivered_n * 1e6:.1f}, writer child "
          f"{(cpu1[1] - cpu0[1] - cpu1[0] + cpu0[0]) / delivered_n * 1e6:.1f}] "
          + ", ".join(f"{k} {v / delivered_n * 1e6:.1f}" for k, v in sorted(per_thread.items(), key=lambda x: -x[1])),
          flush=True)
    size = 0
    if log_dir:
        from appliance.deliverylog import read_segments

        size = _segment_bytes(log_dir)
        kinds: dict[str, int] = {}
        for r in read_segments(log_dir, fill_nulls=False):
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
            if r["kind"] == "log_evicted":
                print(f"  log_evicted: {r.get('reason')}", flush=True)
        print(f"  logged {kinds} for {result['delivered']} delivered messages", flush=True)
        print(f"  closed segments: {sorted(n.rsplit('.', 1)[-1] for n in os.listdir(log_dir) if n[0] != '.')}")
    shutil.rmtree(tmp)
    delivered = max(result["delivered"], 1)
    return (result["delivered_rate"], result["delivered"], size, (cpu1[0] - cpu0[0]) / delivered,
            (cpu1[1] - cpu0[1]) / delivered)


def broker_ratio(rounds: int, duration: float, mode: str, formats: tuple[str, ...], writer_cpu: str = "broker",
                 spy_dir: str = "", writer_nice: int | None = None, paced_rate: float = 0.0) -> None:
    """Our broker's QoS1 delivered rate and CPU per message, logging off and on in each format, interleaved."""
    import statistics

    configs: list[str | None] = [None, *formats]
    runs: dict[str | None, list[tuple[float, float, float]]] = {c: [] for c in configs}
    per_msg: dict[str, list[float]] = {f: [] for f in formats}
    for r in range(rounds):
        for fmt in configs[r % len(configs):] + configs[: r % len(configs)]:  # rotate the order each round
            spy_out = os.path.join(spy_dir, f"round{r}-{fmt or 'off'}.txt") if spy_dir else ""
            rate, delivered, size, cpu_broker, cpu_tree = _broker_round(fmt is not None, duration, mode, fmt or "",
                                                                        writer_cpu, spy_out, writer_nice,
                                                                        paced_rate)
            runs[fmt].append((rate, cpu_broker, cpu_tree))
            if fmt is not None:
                per_msg[fmt].append(size / max(delivered, 1))

    def med(rows: list[tuple[float, float, float]], i: int) -> float:
        return statistics.median(row[i] for row in rows)

    off = runs[None]
    where = "the broker's core" if writer_cpu == "broker" else "the load generator's core"
    if writer_nice is not None:
        where += f", reniced to {writer_nice}"
    if paced_rate:
        where += f", paced at {paced_rate:.0f} msg/s: compare CPU per message, the rates are the same"
    print(f"[writer in a {mode} on {where}, {rounds} rounds of {duration:.0f} s] logging off: {med(off, 0):.0f} msg/s "
          f"{sorted(round(x[0]) for x in off)}, broker CPU {med(off, 1) * 1e6:.1f} µs/message")
    for fmt in formats:
        on = runs[fmt]
        print(f"  {fmt}: {med(on, 0):.0f} msg/s {sorted(round(x[0]) for x in on)}, wall ratio "
              f"{med(on, 0) / med(off, 0):.2f}; CPU per delivered message: broker {med(on, 1) * 1e6:.1f} µs "
              f"(ratio {med(off, 1) / med(on, 1):.2f}), broker + writer child {med(on, 2) * 1e6:.1f} µs "
              f"(ratio {med(off, 2) / med(on, 2):.2f}); log {statistics.median(per_msg[fmt]):.1f} B/message "
              f"{[round(x, 1) for x in per_msg[fmt]]}")


def main() -> None:
    """Print the figures."""
    import asyncio
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        sys.exit(asyncio.run(_serve(*sys.argv[2:7])))
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--broker-rounds", type=int, default=0, help="also run our broker on/off this many rounds")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--mode", choices=["process", "thread"], default="process", help="where the writer runs")
    ap.add_argument("--format", choices=[*FORMATS, "both"], default="both", help="closed segment format")
    ap.add_argument("--writer-cpu", choices=["broker", "other"], default="broker",
                    help="writer child pinned with the broker (one core, the worst case) or moved to the other core")
    ap.add_argument("--writer-nice", type=int, default=None, metavar="N",
                    help="renice the writer child to N (default: leave the product's nice 10)")
    ap.add_argument("--flush-ms", type=float, default=None, metavar="MS",
                    help="the broker's delivery-log drain interval (default: DeliveryLog's 50 ms)")
    ap.add_argument("--paced", type=float, default=0.0, metavar="RATE",
                    help="broker rounds publish at RATE msg/s (loadgen latency) instead of saturating (loadgen qos1)")
    ap.add_argument("--py-spy", default="", metavar="DIR",
                    help="sample each broker round with py-spy (GIL holders) into DIR and print where the time went")
    args = ap.parse_args()
    if args.flush_ms is not None:  # the broker rounds' servers inherit it
        os.environ[FLUSH_ENV] = str(args.flush_ms / 1000)
    if args.py_spy:
        os.makedirs(args.py_spy, exist_ok=True)
    formats = FORMATS if args.format == "both" else (args.format,)
    if args.broker_rounds:
        broker_ratio(args.broker_rounds, args.duration, args.mode, formats, args.writer_cpu, args.py_spy,
                     args.writer_nice, args.paced)
        return
    n = args.messages
    print(f"NullEventSink: {null_cost(n):.2f} µs CPU per message (5 events)")
    for fmt in formats:
        for process in (True, False):
            parent, child, per_msg = side_cost(n, process, fmt)
            where = "child process" if process else "thread"
            print(f"[{fmt}] writer in a {where}: broker-process CPU {parent:.2f} µs/message, writer child CPU "
                  f"{child:.2f} µs/message, {per_msg:.1f} B/message (5 events)")
    for fmt in formats:
        for level in (1, 6):
            for rate in (100.0, 5000.0):
                us, per_msg = writer_cost(n // 2, level, rate, fmt)
                print(f"[{fmt}] writer, journal gzip-{level} @ {rate:.0f} msg/s: {us:.2f} µs CPU/event, "
                      f"{per_msg:.1f} B per message (5 events)")
    d = tempfile.mkdtemp()
    try:
        off, on = [], []
        for _ in range(3):
            off.append(qos1_loop(NullEventSink(), n))
            log = DeliveryLog(d, fleet="f", device="d", node="node-a", firmware="1.0", clock_synced=True)
            on.append(qos1_loop(log, n))
            log.close()
        best_off, best_on = max(off), max(on)
        print(f"codec QoS1 loop: off {best_off:.0f} msg/s, on {best_on:.0f} msg/s, ratio {best_on / best_off:.2f}")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
