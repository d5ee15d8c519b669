"""pump(): the emitting thread takes its own events; nothing is lost, doubled or reordered beside the writer thread."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from appliance.broker.model import Message
from appliance.deliverylog import read_segments
from appliance.server.config import load
from appliance.server.node import Node


def _ids(directory: Path, kind: str = "committed") -> list[str]:
    return [r["msg_id"] for r in read_segments(str(directory), fill_nulls=False) if r["kind"] == kind]


def test_pump_takes_the_queue_on_the_calling_thread_and_the_thread_writes_it(make_log, tmp_path):
    log = make_log(flush_interval_s=30.0)  # the thread would not take anything by itself for 30 s
    log.committed(Message("m0", "t", b"", 1, False, "p", 0.0))
    log.emit("dropped", msg_id="m1", reason="queue_full")
    assert log.backlog == 2
    log.pump()
    assert (log.backlog, log.pumped) == (0, 1)
    log.pump()  # nothing queued: nothing taken
    assert log.pumped == 1
    log.flush()
    records = read_segments(str(tmp_path / "log"), fill_nulls=False)
    assert [(r["kind"], r["msg_id"]) for r in records] == [("committed", "m0"), ("dropped", "m1")]


def test_pumps_racing_emitters_and_flushes_lose_and_double_nothing(make_log, tmp_path):
    log = make_log(flush_interval_s=0.01)
    n = 20_000
    done = threading.Event()

    def emitter() -> None:
        for i in range(n):
            log.record_committed((time.monotonic_ns(), f"m{i}"))
            if i % 200 == 0:
                time.sleep(0.001)  # the three threads interleave for a while
        done.set()

    def flusher() -> None:
        while not done.is_set():
            log.flush()

    threads = [threading.Thread(target=emitter), threading.Thread(target=flusher)]
    for t in threads:
        t.start()
    while not done.is_set():
        log.pump()
        time.sleep(0.0005)
    for t in threads:
        t.join()
    log.close()
    assert log.pumped > 1
    assert _ids(tmp_path / "log") == [f"m{i}" for i in range(n)]


def test_without_pumps_the_thread_takes_the_queue_itself(make_log, tmp_path):
    log = make_log(flush_interval_s=0.02)
    log.emit("dropped", msg_id="m0", reason="queue_full")
    deadline = time.monotonic() + 10
    while log.backlog and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.backlog == 0 and log.pumped == 0


def test_a_pumped_backlog_overflow_is_recorded(make_log, tmp_path):
    log = make_log(max_backlog=10, flush_interval_s=30.0)
    for i in range(100):
        log.emit("committed", msg_id=f"m{i}")
    log.pump()
    log.close()
    records = read_segments(str(tmp_path / "log"), fill_nulls=False)
    assert records[0]["kind"] == "log_evicted" and records[0]["reason"] == "backlog events=90"
    assert [r["msg_id"] for r in records[1:]] == [f"m{i}" for i in range(90, 100)]


def test_the_node_pumps_its_delivery_log_on_its_event_loop(tmp_path):
    config = load(None, {"node": {"data_dir": str(tmp_path / "data")}, "listener": {"tcp": "127.0.0.1:0"},
                         "deliverylog": {"enabled": True, "dir": str(tmp_path / "log")}})

    async def run() -> int:
        node = Node(config)
        await node.async_start()
        try:
            assert node.delivery_log is not None
            deadline = time.monotonic() + 10
            while node.delivery_log.pumped == 0 and time.monotonic() < deadline:
                node.delivery_log.emit("peer_up", peer_node="n2")  # the thread took node_start before the first pump
                await asyncio.sleep(0.05)
            return node.delivery_log.pumped
        finally:
            node.stop()
            await node.async_run_until_stopped()

    assert asyncio.run(run()) >= 1
    kinds = [r["kind"] for r in read_segments(str(tmp_path / "log"), fill_nulls=False)]
    assert kinds[0] == "node_start" and kinds[-1] == "node_stop"
