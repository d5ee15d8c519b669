"""Store benchmark: hot-path submit cost, writer CPU per message, group-commit throughput of a QoS1 flow, load() time.

Run: .venv/bin/python -m bench.store_bench [--messages N] [--queued N] [--rate R] [--dir DIR on a real disk]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from appliance.broker.model import Delivery, DeliveryState, Message
from appliance.protocol.packets import NO_PROPERTIES, Properties
from appliance.store import SqliteStore


def _message(i: int, payload: bytes, props: Properties | None = None) -> Message:
    return Message(
        f"n1-{i}", f"bench/{i % 10}", payload, 1, False, f"pub{i % 10}", time.time(), properties=props or NO_PROPERTIES
    )


def bench_submit_cost(directory: Path, n: int) -> dict[str, float]:
    """Microseconds per enqueue + after_commit call on the caller's thread (writer not running)."""
    store = SqliteStore(directory / "submit.db")
    store.open()
    payload = b"x" * 100
    msgs = [_message(i, payload) for i in range(n)]
    noop = int
    deliveries = [Delivery(i + 1, m, 1, False) for i, m in enumerate(msgs)]
    c0, t0 = time.process_time(), time.perf_counter()
    for i, d in enumerate(deliveries):
        store.enqueue("sub", d)
        store.after_commit(noop, i)
    c1, t1 = time.process_time(), time.perf_counter()
    baseline = []
    b0 = time.process_time()
    for i, d in enumerate(deliveries):  # the least any queued call could cost: two tuple appends
        baseline.append((5, ("sub", d.seq, d.message, d.qos, d.retain, None, d.packet_id, d.state, d.attempts)))
        baseline.append((13, (noop, (i,))))
    b1 = time.process_time()
    store.close()
    return {
        "submit_wall_us": (t1 - t0) / n * 1e6,
        "submit_cpu_us": (c1 - c0) / n * 1e6,
        "bare_append_cpu_us": (b1 - b0) / n * 1e6,
    }


async def bench_qos1_flow(directory: Path, n: int, burst: int, rate: float | None) -> dict[str, float]:
    """QoS1 publisher -> persistent subscriber: enqueue, after_commit(PUBACK), SENT, later remove (its PUBACK)."""
    store = SqliteStore(directory / "flow.db")
    store.open()
    store.start()
    loop = asyncio.get_running_loop()
    payload = b"x" * 100
    latencies: list[float] = []
    done = asyncio.Event()
    acked = 0

    def puback(started: float) -> None:
        nonlocal acked
        latencies.append(time.perf_counter() - started)
        acked += 1
        if acked == n:
            done.set()

    previous: list[int] = []
    t0 = time.perf_counter()
    seq = 0
    while seq < n:
        current = []
        for _ in range(min(burst, n - seq)):
            seq += 1
            store.enqueue("sub", Delivery(seq, _message(seq, payload), 1, False))
            store.after_commit(puback, time.perf_counter())
            store.update_delivery("sub", seq, DeliveryState.SENT, seq % 65535 + 1)
            current.append(seq)
        for s in previous:  # the subscriber's PUBACKs for the previous burst arrive now
            store.remove_delivery("sub", s)
        previous = current
        if rate:
            await asyncio.sleep(burst / rate)
        else:
            await asyncio.sleep(0)
        while store.stats()["pending"] > 50_000:
            await asyncio.sleep(0.001)
    for s in previous:
        store.remove_delivery("sub", s)
    await asyncio.wait_for(done.wait(), 300)
    elapsed = time.perf_counter() - t0
    stats = store.stats()
    await store.async_close()
    del loop
    latencies.sort()
    return {
        "messages": n,
        "messages_per_s": n / elapsed,
        "store_ops_per_s": stats["ops"] / elapsed,
        "commits": stats["commits"],
        "fsyncs_per_s": stats["commits"] / elapsed,
        "batch_mean": stats["batch_mean"],
        "batch_max": stats["batch_max"],
        "ops_elided": stats["ops_elided"],
        "commit_latency_mean_ms": stats["commit_latency_mean_ms"],
        "commit_latency_p99_ms": stats["commit_latency_p99_ms"],
        "ack_latency_p50_ms": 1000 * latencies[len(latencies) // 2],
        "ack_latency_p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "ack_latency_max_ms": 1000 * latencies[-1],
    }


def bench_writer_cpu(directory: Path, batches: int = 300, per_batch: int = 150, sent_at_once: bool = True
                     ) -> dict[str, float]:
    """Writer-thread CPU per message for the broker's QoS1 pattern, one transaction per batch: each message's enqueue
    (already SENT, as Session.enqueue writes a delivery it sends at once; with sent_at_once=False queued and then
    updated, the pattern before 369e49a) interleaved with the PUBACK removal of a message of the previous batch (ops
    as the broker queues them, applied as the writer thread applies them)."""
    import sqlite3

    from appliance.store import batch
    from appliance.store.schema import connect, prepare

    path = directory / f"writer-{int(sent_at_once)}.db"
    prepare(path)
    conn: sqlite3.Connection = connect(path)
    payload = b"x" * 100
    seq, previous, cpu = 0, [], 0.0
    for _ in range(batches):
        ops: list[batch.Op] = []
        acks = list(previous)
        for _ in range(per_batch):
            seq += 1
            pid = seq % 65535 + 1
            if sent_at_once:
                ops.append((batch.ENQUEUE, ("sub", seq, _message(seq, payload), 1, False, None, pid,
                                            DeliveryState.SENT, 0)))
            else:
                ops.append((batch.ENQUEUE, ("sub", seq, _message(seq, payload), 1, False, None, None,
                                            DeliveryState.QUEUED, 0)))
                ops.append((batch.UPDATE_DELIVERY, (DeliveryState.SENT, pid, "sub", seq)))
            if acks:
                ops.append((batch.REMOVE_DELIVERY, ("sub", acks.pop(0))))
        previous = list(range(seq - per_batch + 1, seq + 1))
        c0 = time.thread_time()
        conn.execute("BEGIN")
        batch.apply(conn, ops)
        conn.commit()
        cpu += time.thread_time() - c0
    conn.close()
    return {"writer_cpu_us_per_message": cpu / (batches * per_batch) * 1e6, "messages": batches * per_batch,
            "sent_at_once": sent_at_once}


def bench_load(directory: Path, queued: int, sessions: int) -> dict[str, float]:
    """Seconds for load() of `queued` messages spread over `sessions` sessions (half with v5 properties)."""
    path = directory / "load.db"
    store = SqliteStore(path)
    store.open()
    payload = b"y" * 100
    props = Properties(content_type="application/json", user_properties=[("k", "v")], message_expiry_interval=3600)
    for i in range(queued):
        store.enqueue(
            f"client-{i % sessions}",
            Delivery(i // sessions + 1, _message(i, payload, props if i % 2 else None), 1, False, [7]),
        )
    t0 = time.perf_counter()
    store.close()
    write_s = time.perf_counter() - t0
    runs, cpu = [], []
    for _ in range(3):
        c0, t0 = time.process_time(), time.perf_counter()
        snap = SqliteStore(path).load()
        runs.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        assert sum(len(q) for q in snap.queues.values()) == queued
    open_t0 = time.perf_counter()
    SqliteStore(path).open()
    open_s = time.perf_counter() - open_t0
    return {
        "queued": queued,
        "write_one_batch_s": write_s,
        "open_quick_check_s": open_s,
        "load_s_median": statistics.median(runs),
        "load_s_max": max(runs),
        "load_cpu_s_median": statistics.median(cpu),
        "db_mib": os.path.getsize(path) / 2**20,
    }


def main() -> None:
    """Run the three measurements and print them."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s for the flow (0 = as fast as possible)")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir or Path.cwd()) as tmp:
        directory = Path(tmp)
        print(bench_submit_cost(directory, 100_000))
        print(bench_writer_cpu(directory))
        print(bench_writer_cpu(directory, sent_at_once=False))
        print(asyncio.run(bench_qos1_flow(directory, args.messages, args.burst, args.rate or None)))
        print(bench_load(directory, args.queued, 10))


if __name__ == "__main__":
    main()
