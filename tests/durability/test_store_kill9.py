"""kill -9 a process writing through SqliteStore: every row whose after_commit fired is on disk after restart."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from appliance.store import SqliteStore

REPO = Path(__file__).resolve().parents[2]

# The child: load, continue the seq numbering, enqueue bursts on an asyncio loop, print each seq once committed.
CHILD = r"""
import asyncio, os, random, sys, time
from appliance.broker.model import Delivery, Message
from appliance.store import SqliteStore

path, limit, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)

def confirm(seq):
    os.write(1, b"%d\n" % seq)

async def main():
    store = SqliteStore(path)
    snap = store.load()
    seq = max((d.seq for d in snap.queues.get("c", [])), default=0) + 1
    store.start()
    os.write(1, b"ready\n")
    end = seq + limit
    while seq < end:
        for _ in range(rng.randint(1, 300)):
            msg = Message(f"m{seq}", "t/kill9", os.urandom(rng.randint(10, 2000)), 1, False, "p", time.time())
            store.enqueue("c", Delivery(seq, msg, 1, False))
            store.after_commit(confirm, seq)
            seq += 1
        await asyncio.sleep(rng.choice([0, 0, 0.001, 0.003]))
        while store.stats()["pending"] > 20000:
            await asyncio.sleep(0.002)
    await store.async_close()
    os.write(1, b"done\n")

asyncio.run(main())
"""


def run_round(db: Path, rng: random.Random, round_no: int) -> tuple[list[int], bool]:
    """Run the child, SIGKILL it after random confirmations and a random delay; return what it confirmed."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), "200000", str(round_no)], stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    kill_after = rng.randint(1, 3000)
    printed: list[int] = []
    for line in proc.stdout:
        if line.strip().isdigit():
            printed.append(int(line))
        if len(printed) >= kill_after:
            break
    time.sleep(rng.random() * 0.02)
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    # Lines printed before the kill are in the pipe; a torn last line (no newline) was never a full confirmation.
    reached = len(printed) >= kill_after
    for line in rest.split(b"\n")[:-1]:
        if line.isdigit():
            printed.append(int(line))
    return printed, reached


def test_every_confirmed_row_survives_sigkill(tmp_path):
    db = tmp_path / "store.sqlite3"
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    confirmed: set[int] = set()
    for round_no in range(6):
        printed, reached = run_round(db, rng, round_no)
        assert reached, "child died before the planned kill"
        store = SqliteStore(db)
        store.open()  # quick_check must pass after every kill
        stored = {d.seq for d in store.load().queues.get("c", [])}
        confirmed |= set(printed)
        missing = confirmed - stored
        assert not missing, f"round {round_no}: {len(missing)} confirmed rows lost, e.g. {sorted(missing)[:5]}"
        store.close()
