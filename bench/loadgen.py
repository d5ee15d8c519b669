"""Asyncio MQTT load generator: one workload per run, result as one JSON line on stdout. Loopback only."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench import wire

HOST = "127.0.0.1"  # traffic goes to loopback only
CONNECT_TIMEOUT = 10.0
IDLE_DRAIN = 2.0  # stop waiting for stragglers after this long without progress
MAX_DRAIN = 20.0


@dataclass
class Conn:
    """One MQTT connection: stream pair plus packet splitter."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    split: wire.Reader = field(default_factory=wire.Reader)
    pending: list[tuple[int, memoryview]] = field(default_factory=list)  # read along with an awaited packet

    async def packets(self, timeout: float) -> list[tuple[int, memoryview]]:
        """Packets left over from expect(), else the complete packets in the next read ([] on EOF)."""
        if self.pending:
            out, self.pending = self.pending, []
            return out
        data = await asyncio.wait_for(self.reader.read(262144), timeout)
        if not data:
            return []
        return self.split.feed(data)

    async def expect(self, ptype: int, timeout: float = CONNECT_TIMEOUT) -> memoryview:
        """Read until a packet of ptype arrives (others are ignored); bounded by timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no packet type {ptype} within {timeout} s")
            data = await asyncio.wait_for(self.reader.read(65536), left)
            if not data:
                raise ConnectionError(f"closed while waiting for packet type {ptype}")
            pkts = self.split.feed(data)
            for k, (first, body) in enumerate(pkts):
                if first >> 4 == ptype:
                    self.pending += pkts[k + 1 :]  # e.g. queued PUBLISHes right behind the CONNACK
                    return body

    def close(self) -> None:
        """Send DISCONNECT and close."""
        with contextlib.suppress(Exception):
            self.writer.write(wire.disconnect())
            self.writer.close()


async def connect(port: int, client_id: str, clean: bool = True, keepalive: int = 300) -> Conn:
    """Open a TCP connection, send CONNECT, require CONNACK return code 0."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port, limit=1 << 20), CONNECT_TIMEOUT)
    conn = Conn(reader, writer)
    writer.write(wire.connect(client_id, clean, keepalive))
    body = await conn.expect(wire.CONNACK)
    if body[1] != 0:
        raise ConnectionError(f"CONNACK return code {body[1]} for {client_id}")
    return conn


async def subscribe(conn: Conn, topic_filter: str, qos: int) -> None:
    """SUBSCRIBE and wait for a granted SUBACK."""
    conn.writer.write(wire.subscribe(1, topic_filter, qos))
    body = await conn.expect(wire.SUBACK)
    if body[2] == 0x80:
        raise ConnectionError(f"SUBSCRIBE {topic_filter} refused")


class Sink:
    """A subscriber that counts PUBLISHes, acks QoS1 (one write per read) and optionally records latency."""

    def __init__(self, conn: Conn, latency: bool = False, ids: bool = False) -> None:
        """Count only, or also keep per-message latency (payload starts with monotonic_ns) or unique ids."""
        self.conn, self.latency, self.ids = conn, latency, ids
        self.count = 0
        self.first_at = 0.0
        self.last_at = 0.0
        self.lat_ns: list[int] = []
        self.seen: set[bytes] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Receive until stop is set or the connection closes."""
        conn = self.conn
        while not stop.is_set():
            try:
                pkts = await conn.packets(0.2)
            except TimeoutError:
                continue
            if not pkts:
                return
            now_ns = time.monotonic_ns()
            acks = []
            n = 0
            for first, body in pkts:
                if first >> 4 != wire.PUBLISH:
                    continue
                n += 1
                if first & 0x06 or self.latency or self.ids:
                    _topic, pid, payload = wire.publish_fields(first, body)
                    if pid:
                        acks.append(wire.puback(pid))
                    if self.latency:
                        self.lat_ns.append(now_ns - struct.unpack_from("!Q", payload)[0])
                    if self.ids:
                        self.seen.add(bytes(payload[:8]))
            if n:
                if not self.count:
                    self.first_at = now_ns / 1e9
                self.count += n
                self.last_at = now_ns / 1e9
            if acks:
                conn.writer.write(b"".join(acks))

    async def drain(self, expected: int, stop: asyncio.Event, most: float = MAX_DRAIN, idle: float = IDLE_DRAIN,
                    first_idle: float | None = None) -> None:
        """Wait for expected messages, until idle s without progress (first_idle before the first) or most s; stop."""
        deadline = time.monotonic() + most
        last, last_change = self.count, time.monotonic()
        while self.count < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if self.count != last:
                last, last_change = self.count, time.monotonic()
            elif time.monotonic() - last_change > (idle if self.count or first_idle is None else first_idle):
                break
        stop.set()


def payload_of(size: int, pub: int, seq: int) -> bytes:
    """A payload of size bytes starting with (publisher, sequence)."""
    return struct.pack("!II", pub, seq).ljust(size, b"x")


async def qos0_fanin(a: argparse.Namespace) -> dict[str, Any]:
    """N publishers blast QoS0 to one subscriber; delivered rate and losses."""
    sub = await connect(a.port, "bench-q0-sub")
    await subscribe(sub, "bench/q0/#", 0)
    sink, stop = Sink(sub), asyncio.Event()
    sink_task = asyncio.create_task(sink.run(stop))
    pubs = [await connect(a.port, f"bench-q0-pub{i}") for i in range(a.publishers)]
    sent = [0] * a.publishers
    batch = 64
    t0 = time.monotonic()
    end = t0 + a.duration

    async def blast(i: int, conn: Conn) -> None:
        chunk = wire.publish(f"bench/q0/{i:02d}", payload_of(a.payload, i, 0)) * batch
        limit = a.max_messages // a.publishers
        while sent[i] < limit and time.monotonic() < end:
            conn.writer.write(chunk)
            sent[i] += batch
            await conn.writer.drain()

    await asyncio.gather(*(blast(i, c) for i, c in enumerate(pubs)))
    t_pub = time.monotonic() - t0
    await sink.drain(sum(sent), stop)
    await sink_task
    for c in (*pubs, sub):
        c.close()
    span = max(sink.last_at - t0, 1e-9)
    return {"published": sum(sent), "delivered": sink.count, "lost": sum(sent) - sink.count,
            "publish_rate": sum(sent) / t_pub, "delivered_rate": sink.count / span, "seconds": span}


async def qos1_pipelined(a: argparse.Namespace) -> dict[str, Any]:
    """N publishers keep a window of unacked QoS1 PUBLISHes open; one QoS1 subscriber acks everything."""
    sub = await connect(a.port, "bench-q1-sub", clean=False)  # persistent: a durable broker must store before PUBACK
    await subscribe(sub, "bench/q1/#", 1)
    sink, stop = Sink(sub, ids=True), asyncio.Event()
    sink_task = asyncio.create_task(sink.run(stop))
    pubs = [await connect(a.port, f"bench-q1-pub{i}") for i in range(a.publishers)]
    acked = [0] * a.publishers
    t0 = time.monotonic()
    end = t0 + a.duration
    limit = a.max_messages // a.publishers

    async def pipeline(i: int, conn: Conn) -> None:
        head, _ = wire.publish_template(f"bench/q1/{i:02d}", a.payload)
        pad = b"x" * (a.payload - 8)
        seq, inflight = 0, 0

        def burst(n: int) -> bytes:
            nonlocal seq
            parts = []
            for _ in range(n):
                seq += 1
                parts.append(head + struct.pack("!HII", seq % 65535 + 1, i, seq) + pad)
            return b"".join(parts)

        first = min(a.window, limit)
        conn.writer.write(burst(first))
        inflight = first
        while inflight:
            try:
                pkts = await conn.packets(MAX_DRAIN)
            except TimeoutError:
                break  # acks stopped coming: the unacked ones count as not published
            if not pkts:
                break
            n = sum(1 for f, _ in pkts if f >> 4 == wire.PUBACK)
            inflight -= n
            acked[i] += n
            more = min(n, limit - seq) if time.monotonic() < end else 0
            if more > 0:
                conn.writer.write(burst(more))
                inflight += more

    await asyncio.gather(*(pipeline(i, c) for i, c in enumerate(pubs)))
    t_pub = time.monotonic() - t0
    await sink.drain(sum(acked), stop)
    await sink_task
    for c in (*pubs, sub):
        c.close()
    span = max(sink.last_at - t0, 1e-9)
    unique = len(sink.seen)
    return {"published_acked": sum(acked), "delivered": unique, "duplicates": sink.count - unique,
            "dropped": sum(acked) - unique, "publish_rate": sum(acked) / t_pub, "delivered_rate": unique / span,
            "seconds": span}


async def latency(a: argparse.Namespace) -> dict[str, Any]:
    """Paced QoS1 publishes (payload carries the send time) from N publishers to one QoS1 subscriber."""
    sub = await connect(a.port, "bench-lat-sub", clean=False)  # persistent, as in qos1
    await subscribe(sub, "bench/lat/#", 1)
    sink, stop = Sink(sub, latency=True), asyncio.Event()
    sink_task = asyncio.create_task(sink.run(stop))
    pubs = [await connect(a.port, f"bench-lat-pub{i}") for i in range(a.publishers)]
    ack_stop = asyncio.Event()
    ack_tasks = [asyncio.create_task(Sink(c).run(ack_stop)) for c in pubs]  # drains PUBACKs
    heads = [wire.publish_template(f"bench/lat/{i:02d}", a.payload)[0] for i in range(a.publishers)]
    pad = b"x" * (a.payload - 8)
    total = int(a.rate * a.duration)
    t0 = time.monotonic()
    for k in range(total):
        delay = t0 + k / a.rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        i = k % a.publishers
        pubs[i].writer.write(heads[i] + struct.pack("!HQ", k % 65535 + 1, time.monotonic_ns()) + pad)
    t_pub = time.monotonic() - t0
    await sink.drain(total, stop)
    await sink_task
    ack_stop.set()
    await asyncio.gather(*ack_tasks)
    for c in (*pubs, sub):
        c.close()
    lat = sorted(sink.lat_ns)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6 if lat else float("nan")

    return {"published": total, "delivered": sink.count, "lost": total - sink.count, "offered_rate": total / t_pub,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": lat[-1] / 1e6 if lat else float("nan")}


def vm_rss_kb(pid: int) -> int:
    """VmRSS of pid in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def idle_sessions(a: argparse.Namespace) -> dict[str, Any]:
    """Open N clean_session=0 connections (each with one QoS1 subscription); broker RSS before and after."""
    before = vm_rss_kb(a.broker_pid)
    conns: list[Conn] = []
    failures = 0
    gate = asyncio.Semaphore(50)
    deadline = time.monotonic() + a.duration

    async def one(i: int) -> None:
        nonlocal failures
        if time.monotonic() > deadline:
            failures += 1
            return
        async with gate:
            try:
                c = await connect(a.port, f"bench-idle-{i}", clean=False, keepalive=600)
                await subscribe(c, f"bench/idle/{i}", 1)
                conns.append(c)
            except (OSError, TimeoutError, ConnectionError):
                failures += 1

    t0 = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(a.sessions)))
    t_connect = time.monotonic() - t0
    await asyncio.sleep(1.0)
    after = vm_rss_kb(a.broker_pid)
    for c in conns:
        c.close()
    n = len(conns)
    return {"sessions": n, "failed": failures, "rss_before_kb": before, "rss_after_kb": after,
            "per_conn_kb": (after - before) / n if n else float("nan"), "rss_total_mb": after / 1024,
            "connect_seconds": t_connect}


async def restart_fill(a: argparse.Namespace) -> dict[str, Any]:
    """Register a persistent QoS1 subscriber, go offline, then queue N QoS1 messages for it (all PUBACKed)."""
    sub = await connect(a.port, "bench-restart-sub", clean=False)
    await subscribe(sub, "bench/restart", 1)
    sub.close()
    await asyncio.sleep(0.2)
    pubs = [await connect(a.port, f"bench-restart-pub{i}") for i in range(a.publishers)]
    share = a.messages // a.publishers
    acked = [0] * a.publishers

    async def pipeline(i: int, conn: Conn) -> None:
        head, _ = wire.publish_template("bench/restart", a.payload)
        pad = b"x" * (a.payload - 8)
        sent = 0

        def burst(n: int) -> bytes:
            nonlocal sent
            out = []
            for _ in range(n):
                sent += 1
                out.append(head + struct.pack("!HII", sent % 65535 + 1, i, sent) + pad)
            return b"".join(out)

        conn.writer.write(burst(min(a.window, share)))
        while acked[i] < share:
            try:
                pkts = await conn.packets(MAX_DRAIN)
            except TimeoutError:
                break
            if not pkts:
                break
            n = sum(1 for f, _ in pkts if f >> 4 == wire.PUBACK)
            acked[i] += n
            more = min(n, share - sent)
            if more > 0:
                conn.writer.write(burst(more))

    t0 = time.monotonic()
    await asyncio.gather(*(pipeline(i, c) for i, c in enumerate(pubs)))
    for c in pubs:
        c.close()
    return {"queued_acked": sum(acked), "fill_seconds": time.monotonic() - t0}


async def restart_drain(a: argparse.Namespace) -> dict[str, Any]:
    """Poll until the (re)starting broker accepts, resume the persistent session, time the queued deliveries."""
    deadline = time.monotonic() + a.duration
    sub = None
    while time.monotonic() < deadline:
        try:
            sub = await connect(a.port, "bench-restart-sub", clean=False)
            break
        except (OSError, TimeoutError, ConnectionError):
            await asyncio.sleep(0.01)
    if sub is None:
        return {"error": "broker did not accept within the time bound"}
    t_conn = time.monotonic()
    sink, stop = Sink(sub, ids=True), asyncio.Event()
    task = asyncio.create_task(sink.run(stop))
    await sink.drain(a.messages, stop, most=a.duration, idle=5.0, first_idle=a.duration)  # a slow reload is not loss
    await task
    sub.close()
    return {"connected_at": t_conn, "first_at": sink.first_at or None, "last_at": sink.last_at or None,
            "delivered": len(sink.seen), "duplicates": sink.count - len(sink.seen)}


WORKLOADS = {"qos0": qos0_fanin, "qos1": qos1_pipelined, "latency": latency, "rss": idle_sessions,
             "restart-fill": restart_fill, "restart-drain": restart_drain}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run one workload, print its result as JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.loadgen")
    p.add_argument("workload", choices=sorted(WORKLOADS))
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--publishers", type=int, default=10)
    p.add_argument("--duration", type=float, default=5.0, help="seconds of load (or of waiting, for rss/drain)")
    p.add_argument("--max-messages", type=int, default=5_000_000, help="count bound across all publishers")
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--window", type=int, default=64, help="unacked QoS1 PUBLISHes per publisher")
    p.add_argument("--rate", type=float, default=1500.0)
    p.add_argument("--sessions", type=int, default=5000)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--broker-pid", type=int, default=0)
    a = p.parse_args(argv)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(WORKLOADS[a.workload](a)) | {"loop": "asyncio"}
    else:
        result = uvloop.run(WORKLOADS[a.workload](a)) | {"loop": "uvloop"}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
