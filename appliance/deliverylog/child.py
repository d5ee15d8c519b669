"""Entry point of the delivery-log writer child process (see worker.py for the frame protocol)."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import time
from dataclasses import asdict

from .identity import Identity, clock_sync_probe
from .segments import write_all
from .worker import FrameReader, send, unpack_recorded
from .writer import DeliveryLogError, Limits, SegmentWriter

TICK_S = 0.2
# The lowest priority: the child only has to keep up on average (the pipe and the drain absorb bursts), while a
# process it shares a core with (the broker on a small device, anything else) must never wait for it: at nice 10 a
# waking neighbour still queued behind it often enough to cost the broker's clients throughput (bench/RESULTS.md).
NICE = 19


def _stats_json(writer: SegmentWriter) -> bytes:
    return json.dumps(asdict(writer.stats)).encode()


class _FdOut:
    """A write/flush file over a raw fd."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> int:
        write_all(self.fd, data)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""


def main() -> int:
    """Child entry point: serve frames from stdin until C or EOF."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent decides when we stop (C frame or EOF)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.nice(NICE)  # background work: on a busy core the broker comes first, we use its idle time (fsync waits)
    except OSError:
        pass
    out = _FdOut(sys.stdout.fileno())  # unbuffered: nothing left to fail at exit if the parent is gone
    reader = FrameReader(sys.stdin.fileno())
    frame = reader.read()
    if frame is None or frame[0] != b"S":
        return 2
    cfg = json.loads(frame[1])
    try:
        writer = SegmentWriter(
            cfg["directory"], Identity(**cfg["identity"]), Limits(**cfg["limits"]),
            clock_sync_probe(cfg["clock_synced"]), cfg["seq_property"],
        )
    except (DeliveryLogError, OSError) as exc:
        send(out, b"E", str(exc).encode())
        return 1
    gc.collect()
    gc.freeze()  # modules and set-up live as long as we do: collections need not walk them
    try:
        return _serve(reader, out, writer)
    except BrokenPipeError:  # the parent died while we answered: write what it sent, close the segment cleanly
        while (frame := reader.read()) is not None:
            if frame[0] == b"B":
                writer.write_packed(frame[1])
            elif frame[0] == b"W":
                writer.write_lanes_packed(frame[1])
            elif frame[0] == b"X":
                writer.write_lanes(*unpack_recorded(frame[1]))
        writer.close()
        return 0


def _serve(reader: FrameReader, out: _FdOut, writer: SegmentWriter) -> int:
    """Frame loop; returns the exit code."""
    send(out, b"A", _stats_json(writer))
    if writer.limits.format == "parquet":  # while the broker finishes starting; its first batches wait in the pipe
        from .columnar import warm_up

        try:
            warm_up()
        except Exception:  # only a warm-up: the same failure is met, and counted, at the first segment
            pass
    last_tick = time.monotonic()
    while True:
        ready, _, _ = select.select([reader.fd], [], [], TICK_S) if not reader.buf else ([reader.fd], [], [])
        if time.monotonic() - last_tick >= TICK_S:
            writer.tick()
            last_tick = time.monotonic()
        if not ready:
            continue
        frame = reader.read()
        if frame is None:
            writer.close()
            return 0
        kind, payload = frame
        if kind == b"W":
            writer.write_lanes_packed(payload)
        elif kind == b"X":
            writer.write_lanes(*unpack_recorded(payload))
        elif kind == b"B":
            writer.write_packed(payload)
        elif kind == b"L":
            reason, events = json.loads(payload)
            writer.record_loss(reason, events)
        elif kind == b"F":
            writer.sync()
            send(out, b"A", _stats_json(writer))
        elif kind == b"R":
            writer.write([])
            writer.rotate()
            send(out, b"A", _stats_json(writer))
        elif kind == b"C":
            writer.close()
            send(out, b"A", _stats_json(writer))
            return 0

if __name__ == "__main__":
    sys.exit(main())
