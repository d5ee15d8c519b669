"""SIGKILL while writing: everything flushed before the kill survives, the open segment is recovered, no duplicates."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from appliance.deliverylog import DeliveryLog, read_segment, read_segments
from appliance.deliverylog.segments import PART, closed_segments

from .conftest import BOOT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_and_kill(directory, run, segment_bytes, mode, rng):
    """Start the child, let it write for a random while, SIGKILL it; return the last index it reported flushed."""
    child = subprocess.Popen([sys.executable, "-m", "tests.deliverylog.crash_child", directory, run,
                              str(segment_bytes), mode], start_new_session=True, cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    last = -1
    first_line = child.stdout.readline()  # writing has started
    assert first_line, "child produced no output"
    last = int(first_line)
    deadline = time.monotonic() + rng.uniform(0.05, 0.6)
    os.set_blocking(child.stdout.fileno(), False)
    while time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(child.pid, signal.SIGKILL)  # the emitting process and its writer process die at the same instant
    child.wait()
    os.set_blocking(child.stdout.fileno(), True)
    for line in child.stdout.read().splitlines():  # lines printed before the kill = flushed before the kill
        last = int(line)
    return last


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_sigkill_during_writing_loses_nothing_flushed_and_duplicates_nothing(tmp_path, mode):
    rng = random.Random()
    directory = str(tmp_path / "log")
    reported = {}
    for n in range(5):
        run = f"r{n}"
        # small segments rotate under the kills; the last run's single large segment is always open when killed
        reported[run] = _run_and_kill(directory, run, 4096 if n < 4 else 1 << 24, mode, rng)
    parts_left = [n for n in os.listdir(directory) if n.endswith(PART)]
    assert parts_left, "the last kill must leave an open segment to recover"
    DeliveryLog(directory, fleet="f", device="d", node="n1", firmware="1", boot_id=BOOT).close()  # recovers
    assert not [n for n in os.listdir(directory) if n.endswith((PART, ".tmp"))]
    assert all(n.endswith(".parquet") for n in closed_segments(directory))  # kills often land mid-conversion
    assert all(read_segment(os.path.join(directory, n)).complete for n in closed_segments(directory))
    records = read_segments(directory)
    event_ids = [r["event_id"] for r in records]
    assert len(event_ids) == len(set(event_ids))
    for run, last in reported.items():
        got = [int(r["msg_id"].split("-")[1]) for r in records if r["msg_id"].startswith(run + "-")]
        assert got == list(range(len(got))), f"{run}: records are not a clean prefix"
        assert len(got) >= last + 1, f"{run}: flushed up to {last} but only {len(got)} records survived"


def test_a_killed_broker_process_leaves_its_writer_to_close_the_segment_cleanly(tmp_path):
    directory = str(tmp_path / "log")
    child = subprocess.Popen([sys.executable, "-m", "tests.deliverylog.crash_child", directory, "r0", str(1 << 24),
                              "process"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    last = int(child.stdout.readline())
    time.sleep(0.2)
    child.send_signal(signal.SIGKILL)  # only the emitting process: its writer sees EOF on the pipe
    child.wait()
    last = max([last, *(int(line) for line in child.stdout.read().splitlines())])
    deadline = time.monotonic() + 60
    while [n for n in os.listdir(directory) if n.endswith(PART)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [n for n in os.listdir(directory) if n.endswith(PART)], f"open segment left: {os.listdir(directory)}"
    (name,) = closed_segments(directory)
    content = read_segment(os.path.join(directory, name))
    assert content.complete
    got = [int(r["msg_id"].split("-")[1]) for r in content.records]
    assert got == list(range(len(got))), "records are not a clean prefix"
    assert len(got) >= last + 1, f"flushed up to {last} but only {len(got)} records survived"


def test_a_killed_writer_process_is_restarted_and_the_loss_recorded(tmp_path):
    directory = str(tmp_path / "log")
    log = DeliveryLog(directory, fleet="f", device="d", node="n1", firmware="1", boot_id=BOOT, clock_synced=True,
                      flush_interval_s=30.0)
    for i in range(100):
        log.emit("committed", msg_id=f"a{i}")
    log.flush()
    os.kill(log._writer.proc.pid, signal.SIGKILL)
    log._writer.proc.wait()
    for i in range(100):
        log.emit("committed", msg_id=f"b{i}")
    log.flush()  # the batch meets the dead writer: a new one starts, recovers its segment, records the loss
    for i in range(10):
        log.emit("committed", msg_id=f"c{i}")
    log.close()
    assert log._writer.restarts == 1
    records = read_segments(directory)
    ids = [r["msg_id"] for r in records if r["kind"] == "committed"]
    assert ids[:100] == [f"a{i}" for i in range(100)]
    assert ids[-10:] == [f"c{i}" for i in range(10)]
    lost = [r["reason"] for r in records if r["kind"] == "log_evicted"]
    assert lost == ["writer_restart events=100"]
    assert len({r["event_id"] for r in records}) == len(records)
