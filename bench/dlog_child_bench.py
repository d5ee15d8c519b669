"""The delivery-log writer child's CPU per message: a replay of drained lanes batches into a Parquet SegmentWriter.

Run: .venv/bin/python -m bench.dlog_child_bench [--messages 200000] [--batch 3500] [--profile]
Each message is the five hot events of a QoS1 message (received with a `seq` user property, committed, routed,
delivered, acked), in batches as DeliveryLog drains them (one lane per kind), marshalled as the pipe carries them.
Reports process CPU per message from the first batch after a warm-up (pyarrow imported, one batch written).
"""

from __future__ import annotations

import argparse
import cProfile
import marshal
import pstats
import tempfile
import time

from appliance.deliverylog.columnar import warm_up
from appliance.deliverylog.identity import Identity
from appliance.deliverylog.writer import Limits, SegmentWriter

BOOT = "0b7c3a5e-9d1f-4c2a-8e6b-5f4d3c2b1a09"


def frames(messages: int, batch: int) -> list[bytes]:
    """Marshalled (offset, stepped, lanes) batches of `batch` messages each."""
    out = []
    mono = time.monotonic_ns()
    for start in range(0, messages, batch):
        lanes: list[list[object]] = [[] for _ in range(6)]
        for i in range(start, min(messages, start + batch)):
            msg_id, users = f"node-a:{i}", [("seq", str(i))]
            lanes[1] += (mono, msg_id, "sensor-17", "plant/line3/sensor-17/temp", 1, False, 64, users, i % 65535 + 1)
            lanes[3] += (mono + 200, msg_id, "historian", "plant/+/+/temp", 1)
            lanes[4] += (mono + 400, msg_id, "historian", 1, False, 1)
            lanes[2] += (mono + 600, msg_id)
            lanes[5] += (mono + 800, msg_id, "historian", 1)
            mono += 1000
        out.append(marshal.dumps((10**18, False, lanes), 4))
    return out


def main() -> None:
    """Replay and print CPU us per message (and the top of a profile with --profile)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=3500)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    batches = frames(args.messages, args.batch)
    with tempfile.TemporaryDirectory() as d:
        writer = SegmentWriter(d, Identity("fleet", "dev", "node-a", "1", BOOT),
                               Limits(format="parquet", budget_bytes=1 << 30, segment_bytes=64 << 20), lambda: True)
        warm_up()
        writer.write_lanes_packed(batches[0])
        prof = cProfile.Profile() if args.profile else None
        if prof:
            prof.enable()
        t0 = time.process_time()
        for frame in batches[1:]:
            writer.write_lanes_packed(frame)
        writer.close()
        cpu = time.process_time() - t0
        if prof:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    n = args.messages - min(args.batch, args.messages)
    print(f"writer child work: {cpu / n * 1e6:.2f} us CPU per message ({cpu / n / 5 * 1e6:.2f} per event), "
          f"{len(batches[1]) / args.batch:.0f} B per message on the pipe")


if __name__ == "__main__":
    main()
