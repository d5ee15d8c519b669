"""Main-thread CPU per QoS1 message, in process: ClientProtocol + Broker + SqliteStore submits, no sockets, no writer.

10 publishers send 64 QoS1 PUBLISHes each per round into real ClientProtocol objects (fake transports, a fake loop
that runs call_soon callbacks in order); one persistent QoS1 subscriber on bench/q1/# acks everything it got; the
store's pending operations are then taken as the writer would (split, no SQL) and their after_commit callbacks (the
publishers' PUBACKs) run. thread_time per delivered message is what the broker's event-loop thread spends on the
Python side of the QoS1 flow, without the syscalls, uvloop, the writer thread and machine noise: an A/B tool for
hot-path changes (run it from two trees: `cd OTHER && PYTHONPATH=OTHER python -m bench.hotpath_bench`).

    .venv/bin/python -m bench.hotpath_bench [--runs 5] [--rounds 300]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
import types
from collections import deque
from pathlib import Path
from typing import Any

from appliance.broker.broker import Broker
from appliance.broker.settings import BrokerSettings
from appliance.protocol.reason_codes import ReasonCode
from appliance.server.client import ClientProtocol
from appliance.server.flow import FlowControl
from appliance.server.node import GC_THRESHOLDS
from appliance.store import SqliteStore
from appliance.store import batch as ops

PUBLISHERS, WINDOW, PAYLOAD = 10, 64, 100


class _Loop:
    def __init__(self) -> None:
        self.calls: deque[tuple[Any, tuple[Any, ...]]] = deque()

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.calls.append((callback, args))

    def time(self) -> float:
        return time.monotonic()

    def run(self) -> None:
        calls = self.calls
        while calls:
            callback, args = calls.popleft()
            callback(*args)


class _Transport:
    def __init__(self) -> None:
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 1) if key == "peername" else None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass


class _QueueSink:
    """The DeliveryLog's hot emitters (pure-Python lanes or the C recorder), emptied at each flush: no drain thread."""

    def __init__(self, native: bool) -> None:
        from appliance.deliverylog.batch import LANE_KINDS, LANE_WIDTHS, NativeRecorder
        from appliance.deliverylog.sink import DeliveryLog

        if native and NativeRecorder is None:
            raise SystemExit("the recorder sink needs the C recorder, which this install lacks")
        self._lanes: list[list[Any]] = [[] for _ in range(1 + len(LANE_KINDS))]
        self._recorder = NativeRecorder(LANE_WIDTHS) if native else None
        DeliveryLog._queue_to_lanes(self)  # type: ignore[arg-type]
        for name in ("emit", "received"):
            setattr(self, name, types.MethodType(getattr(DeliveryLog, name), self))

    def flush(self) -> None:
        for lane in self._lanes:
            lane.clear()
        if self._recorder is not None:
            self._recorder.clear()

    close = flush


SINKS = ("off", "null", "list", "recorder", "parquet", "parquet-pure", "jsonl.gz")


def event_sink(name: str, directory: Path, flush_interval_s: float = 0.05) -> Any:
    """The event sink of one variant (SINKS), with flush() and close(); None when off.

    null: NullEventSink (a Python no-op per event); list: the pure-Python lanes, emptied at each flush, no drain;
    recorder: the C recorder, emptied at each flush, no drain; otherwise a DeliveryLog of that format (its hot
    events in the C recorder where built, in the pure-Python lanes for parquet-pure).
    """
    if name == "off":
        return None
    if name == "null":
        from appliance.broker.ports import NullEventSink

        sink: Any = NullEventSink()
        sink.flush = sink.close = lambda: None
        return sink
    if name in ("list", "recorder"):
        return _QueueSink(native=name == "recorder")
    from appliance.deliverylog import DeliveryLog

    fmt, _, pure = name.partition("-")
    return DeliveryLog(str(directory / "dlog"), fleet="bench", device="bench", node="bench", firmware="0",
                       clock_synced=True, format=fmt, flush_interval_s=flush_interval_s, native=False if pure else None)


class _Bench:
    def __init__(self, directory: Path, events: Any = None) -> None:
        self.loop = _Loop()
        self.store = SqliteStore(directory / "broker.db")
        self.store.open()
        self.store.load()
        node = types.SimpleNamespace(loop=self.loop, clock=time.time, store=self.store, cluster=None,
                                     connections=set())
        node.broker = Broker(BrokerSettings(node_id="bench"), self.store, clock=time.time, events=events)
        node.flow = FlowControl(self.loop, node.connections)  # type: ignore[arg-type]
        node.config = types.SimpleNamespace(get=lambda *a: False)
        node.authenticator = types.SimpleNamespace(needs_slow_check=lambda *a: False,
                                                   check=lambda *a: ReasonCode.SUCCESS)
        self.node = node
        self.sub, self.sub_out = self._client("bench-q1-sub", clean=False)
        topic_filter = b"bench/q1/#"
        body = b"\x00\x01" + len(topic_filter).to_bytes(2, "big") + topic_filter + b"\x01"
        self.sub.data_received(bytes([0x82, len(body)]) + body)
        self.pubs = [self._client(f"bench-q1-pub{i}", clean=True) for i in range(PUBLISHERS)]
        self._commit()
        self.bursts = [[self._burst(i, k * WINDOW) for i in range(PUBLISHERS)] for k in range(4)]

    def _client(self, client_id: str, clean: bool) -> tuple[ClientProtocol, _Transport]:
        proto, transport = ClientProtocol(self.node), _Transport()  # type: ignore[arg-type]
        proto.connection_made(transport)  # type: ignore[arg-type]
        cid = client_id.encode()
        body = b"\x00\x04MQTT\x04" + (b"\x02" if clean else b"\x00") + b"\x01\x2c" + len(cid).to_bytes(2, "big") + cid
        proto.data_received(bytes([0x10, len(body)]) + body)
        return proto, transport

    @staticmethod
    def _burst(publisher: int, start: int) -> bytes:
        topic = f"bench/q1/{publisher:02d}".encode()
        out = []
        for seq in range(start, start + WINDOW):
            payload = seq.to_bytes(4, "big") + publisher.to_bytes(4, "big") + b"x" * (PAYLOAD - 8)
            variable = len(topic).to_bytes(2, "big") + topic + (seq % 65535 + 1).to_bytes(2, "big")
            out.append(bytes([0x32, len(variable) + len(payload)]) + variable + payload)
        return b"".join(out)

    def _commit(self) -> None:
        """What the writer thread does with the pending operations, minus the SQL: run their callbacks."""
        pending = self.store._pending
        callbacks, _writes = ops.split([pending.popleft() for _ in range(len(pending))])
        for callback, args in callbacks:
            callback(*args)
        self.loop.run()

    def round(self, k: int) -> int:
        """One window from every publisher, the subscriber's PUBACKs, one commit; returns messages delivered."""
        for (proto, _), data in zip(self.pubs, self.bursts[k % 4], strict=True):
            proto.data_received(data)
        self.loop.run()
        data = b"".join(self.sub_out.data)
        self.sub_out.data.clear()
        acks, pos = [], 0
        while pos < len(data):  # 3.1.1 QoS1 PUBLISHes, remaining length < 128
            end = pos + 4 + int.from_bytes(data[pos + 2 : pos + 4], "big")
            acks.append(b"\x40\x02" + data[end : end + 2])
            pos += 2 + data[pos + 1]
        self.sub.data_received(b"".join(acks))
        self._commit()
        for _, transport in self.pubs:
            transport.data.clear()
        return len(acks)


def main() -> None:
    """Measure and print main-thread microseconds per QoS1 message."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--events", choices=SINKS, default="off",
                        help="attach an event sink (see event_sink) and also report the process's other threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = event_sink(args.events, Path(tmp))
        bench = _Bench(Path(tmp), log)
        for k in range(50):
            bench.round(k)
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)  # as the node runs
        per_message, others = [], []
        for _ in range(args.runs):
            t0, p0, n = time.thread_time(), time.process_time(), 0
            for k in range(args.rounds):
                n += bench.round(k)
            if log is not None:
                log.flush()
            main_s = time.thread_time() - t0
            per_message.append(main_s / n * 1e6)
            others.append((time.process_time() - p0 - main_s) / n * 1e6)
        if log is not None:
            log.close()
    result = {"main_thread_us_per_message_median": round(statistics.median(per_message), 2),
              "min": round(min(per_message), 2), "messages_per_run": n, "runs": args.runs}
    if log is not None:  # the drain thread (and the store's idle writer thread): the GIL's other users
        result["other_threads_us_per_message_median"] = round(statistics.median(others), 2)
    print(result)


if __name__ == "__main__":
    main()
