"""SIGKILL while writing: everything flushed before the kill survives, the open segment is recovered, no duplicates."""

import os
import random
import signal
import subprocess
import sys
import time

from appliance.deliverylog import DeliveryLog, read_segment, read_segments
from appliance.deliverylog.segments import PART, closed_segments

from .conftest import BOOT

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_and_kill(directory, run, segment_bytes, rng):
    """Start the child, let it write for a random while, SIGKILL it; return the last index it reported flushed."""
    child = subprocess.Popen([sys.executable, "-m", "tests.deliverylog.crash_child", directory, run,
                              str(segment_bytes)], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    last = -1
    first_line = child.stdout.readline()  # writing has started
    assert first_line, "child produced no output"
    last = int(first_line)
    deadline = time.monotonic() + rng.uniform(0.05, 0.6)
    os.set_blocking(child.stdout.fileno(), False)
    while time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait()
    os.set_blocking(child.stdout.fileno(), True)
    for line in child.stdout.read().splitlines():  # lines printed before the kill = flushed before the kill
        last = int(line)
    return last


def test_sigkill_during_writing_loses_nothing_flushed_and_duplicates_nothing(tmp_path):
    rng = random.Random()
    directory = str(tmp_path / "log")
    reported = {}
    for n in range(5):
        run = f"r{n}"
        # small segments rotate under the kills; the last run's single large segment is always open when killed
        reported[run] = _run_and_kill(directory, run, 4096 if n < 4 else 1 << 24, rng)
    parts_left = [n for n in os.listdir(directory) if n.endswith(PART)]
    assert parts_left, "the last kill must leave an open segment to recover"
    DeliveryLog(directory, fleet="f", device="d", node="n1", firmware="1", boot_id=BOOT).close()  # recovers
    assert not [n for n in os.listdir(directory) if n.endswith(PART)]
    assert all(read_segment(os.path.join(directory, n)).complete for n in closed_segments(directory))
    records = read_segments(directory)
    event_ids = [r["event_id"] for r in records]
    assert len(event_ids) == len(set(event_ids))
    for run, last in reported.items():
        got = [int(r["msg_id"].split("-")[1]) for r in records if r["msg_id"].startswith(run + "-")]
        assert got == list(range(len(got))), f"{run}: records are not a clean prefix"
        assert len(got) >= last + 1, f"{run}: flushed up to {last} but only {len(got)} records survived"
