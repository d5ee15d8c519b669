"""Start-up checks and fatal write errors: corrupt files, unknown schema versions, a full disk."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from storehelpers import delivery, flush, message, session

from appliance.store import SqliteStore, StoreError
from appliance.store.schema import latest_version


def filled_store(path: Path, rows: int = 2000) -> None:
    """A closed store file with `rows` queued messages (so the queue b-tree has interior pages)."""
    store = SqliteStore(path)
    store.open()
    store.save_session(session("c"))
    for seq in range(1, rows + 1):
        store.enqueue("c", delivery(seq, message(f"m{seq}", payload=b"p" * 200)))
    store.close()


def test_reopen_is_idempotent_and_keeps_data(db_file):
    filled_store(db_file, rows=10)
    for _ in range(3):
        store = SqliteStore(db_file)
        store.open()
        assert store.schema_version == latest_version()
        assert len(store.load().queues["c"]) == 10
        store.close()
    conn = sqlite3.connect(db_file)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == latest_version()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"sessions", "subscriptions", "queue", "retained", "incoming_qos2", "meta"} <= tables


def test_corrupt_queue_tree_fails_integrity_check(db_file):
    filled_store(db_file)
    conn = sqlite3.connect(db_file)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'queue'").fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    assert not Path(f"{db_file}-wal").exists() or Path(f"{db_file}-wal").stat().st_size == 0
    with open(db_file, "r+b") as f:  # scribble over the interior page of the queue table (past its header)
        f.seek((root - 1) * page_size + 16)
        f.write(bytes((i * 37 + 11) % 256 for i in range(page_size - 32)))
    store = SqliteStore(db_file)
    with pytest.raises(StoreError, match="corrupt"):
        store.open()
    with pytest.raises(StoreError, match="corrupt"):
        SqliteStore(db_file, full_integrity_check=True).open()


def test_file_that_is_not_a_database_gives_store_error(db_file):
    db_file.write_bytes(b"this is not an sqlite file at all" * 200)
    with pytest.raises(StoreError, match="not a database"):
        SqliteStore(db_file).open()


def test_newer_schema_version_is_refused(db_file):
    filled_store(db_file, rows=1)
    conn = sqlite3.connect(db_file)
    conn.execute(f"PRAGMA user_version = {latest_version() + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this software"):
        SqliteStore(db_file).open()


def fill_until_fatal(store: SqliteStore, fatal: threading.Event, released: list[int]) -> None:
    """Queue 64 KiB rows, each followed by an after_commit, until the store reports failure (or 200 rows)."""
    big = b"z" * 65536
    for seq in range(1000, 1200):
        try:
            store.enqueue("c", delivery(seq, message(f"big{seq}", payload=big)))
            store.after_commit(released.append, seq)
        except StoreError:
            return
        if seq % 4 == 0 and fatal.wait(0.05):
            return


def test_full_database_is_fatal_and_withholds_callbacks(make_store, db_file):
    probe = make_store()
    probe.close()
    conn = sqlite3.connect(db_file)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    fatal = threading.Event()
    errors: list[StoreError] = []

    def on_fatal(exc: StoreError) -> None:
        errors.append(exc)
        fatal.set()

    store = make_store(on_fatal=on_fatal, pragmas={"max_page_count": pages + 40})
    store.start()
    store.save_session(session("c"))
    for seq in range(1, 6):
        store.enqueue("c", delivery(seq, message(f"small{seq}")))
    flush(store)
    released: list[int] = []
    # Grow the file until SQLite refuses; the commit holding the failing op never releases its callbacks.
    fill_until_fatal(store, fatal, released)
    assert fatal.wait(60), "on_fatal was not called"
    assert "full" in str(errors[0]) and isinstance(errors[0].__cause__, sqlite3.OperationalError)
    with pytest.raises(StoreError, match="refuses writes"):
        store.enqueue("c", delivery(9999, message("late")))
    assert store.stats()["failed"] == 1
    store.close()
    snap = SqliteStore(db_file).load()
    stored = [d.seq for d in snap.queues["c"]]
    assert stored[:5] == [1, 2, 3, 4, 5]
    assert set(released) <= set(stored), "a callback ran for a row that is not on disk"
    assert len(stored) < 5 + 200  # something was really refused


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):
    """A 1 MiB tmpfs mounted under tmp_path (needs root); skipped where mounting is not allowed."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_disk_full_on_a_real_filesystem_is_fatal(tiny_tmpfs, tmp_path):
    loop = asyncio.get_running_loop()
    fatal_on_loop = loop.create_future()
    loop_thread = threading.get_ident()

    def on_fatal(exc: StoreError) -> None:
        fatal_on_loop.set_result((exc, threading.get_ident() == loop_thread))

    path = tiny_tmpfs / "store.sqlite3"
    store = SqliteStore(path, on_fatal=on_fatal)
    store.open()
    store.start()
    released: list[int] = []
    payload = b"q" * 16384
    seq = 0
    while not fatal_on_loop.done() and seq < 400:  # 400 x 16 KiB is far beyond the 1 MiB filesystem
        seq += 1
        try:
            store.enqueue("c", delivery(seq, message(f"m{seq}", payload=payload)))
            store.after_commit(released.append, seq)
        except StoreError:
            break
        if seq % 8 == 0:
            await asyncio.sleep(0.01)
    exc, on_loop = await asyncio.wait_for(fatal_on_loop, 60)
    assert on_loop and "full" in str(exc)
    await store.async_close()
    saved = tmp_path / "saved"
    saved.mkdir()
    for name in os.listdir(tiny_tmpfs):
        shutil.copy(tiny_tmpfs / name, saved / name)
    snap = SqliteStore(saved / "store.sqlite3").load()
    stored = {d.seq for d in snap.queues.get("c", [])}
    assert released, "nothing committed before the disk filled"
    assert set(released) <= stored, "a callback ran for a row that is not on disk"
    assert max(stored) < seq


def test_a_second_process_cannot_open_the_same_store(db_file):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, str(db_file)],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3])),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        with pytest.raises(StoreError, match=f"in use by another process \\(pid {holder.pid}\\)"):
            SqliteStore(db_file).open()
    finally:
        holder.kill()
        holder.wait(30)
    store = SqliteStore(db_file)  # the kernel dropped the dead holder's lock
    store.open()
    assert store.load().meta == {"holder": "was here"}
    store.close()


HOLD_OPEN = """
import sys, time
from appliance.store import SqliteStore
store = SqliteStore(sys.argv[1])
store.open()
store.set_meta("holder", "was here")
store.start()
import threading
done = threading.Event()
store.after_commit(done.set)
done.wait(60)
print("open", flush=True)
time.sleep(120)
"""


def test_unwritable_location_gives_store_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot open the store"):
        SqliteStore(blocker / "data" / "broker.db").open()
