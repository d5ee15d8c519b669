"""Delivery-log costs: emit() ns, writer µs/event, compressed bytes per delivered message, and a QoS1 loop ratio.

Run: .venv/bin/python -m bench.deliverylog_bench [--messages N]
The loop ratio drives the protocol codec for one QoS1 publish -> deliver -> ack per message (a lower bound on the
broker's real per-message work, so the ratio here is pessimistic); the real broker ratio is measured by bench.run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from appliance.broker.ports import NullEventSink
from appliance.deliverylog import DeliveryLog
from appliance.deliverylog.identity import Identity
from appliance.deliverylog.writer import Limits, SegmentWriter
from appliance.protocol.codec import encode_publish
from appliance.protocol.decoder import Decoder

BOOT = "0b7c3a5e-9d1f-4c2a-8e6b-5f4d3c2b1a09"


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


def emit_ns(n: int) -> float:
    """Mean ns per emit() call with five-event messages, writer thread running."""
    d = tempfile.mkdtemp()
    try:
        log = DeliveryLog(d, fleet="f", device="d", node="node-a", firmware="1.0", boot_id=BOOT, clock_synced=True)
        t0 = time.perf_counter_ns()
        for i in range(n // 5):
            _message_events(log, i, i % 65535 + 1)
        t1 = time.perf_counter_ns()
        log.close()
        return (t1 - t0) / n
    finally:
        shutil.rmtree(d)


class _Collect:
    """Collects items the way DeliveryLog.emit does, without a writer thread."""

    def __init__(self) -> None:
        self.items: list = []

    def emit(self, kind, **fields) -> None:
        self.items.append((kind, time.time_ns(), time.monotonic_ns(), fields))


def writer_cost(messages: int, level: int, rate_per_s: float) -> tuple[float, float]:
    """(µs of writer CPU per event, compressed bytes per message) for `messages` messages at `rate_per_s`."""
    c = _Collect()
    for i in range(messages):
        _message_events(c, i, i % 65535 + 1)
    start_wall, start_mono = time.time_ns(), time.monotonic_ns()
    step = int(1e9 / rate_per_s / 5)
    c.items = [(k, start_wall + j * step, start_mono + j * step, f) for j, (k, _, _, f) in enumerate(c.items)]
    d = tempfile.mkdtemp()
    try:
        w = SegmentWriter(d, Identity("fleet-eu", "pi-0042", "node-a", "1.4.2", BOOT), Limits(level=level), lambda: True)
        batch = max(1, int(rate_per_s * 5 * 0.5))  # one writer pass per 0.5 s
        t0 = time.process_time_ns()
        for s in range(0, len(c.items), batch):
            w.write(c.items[s : s + batch])
        w.close()
        cpu = time.process_time_ns() - t0
        size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".gz"))
        return cpu / len(c.items) / 1000, size / messages
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


def main() -> None:
    """Print the figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    args = ap.parse_args()
    n = args.messages
    print(f"emit(): {emit_ns(n * 5):.0f} ns per call")
    for level in (1, 6, 9):
        for rate in (100.0, 5000.0):
            us, per_msg = writer_cost(n // 2, level, rate)
            print(f"writer gzip-{level} @ {rate:.0f} msg/s: {us:.2f} µs CPU/event, {per_msg:.1f} B per delivered message")
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
