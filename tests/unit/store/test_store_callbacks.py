"""after_commit callbacks run on the loop, in order, only once the rows queued before them are durable."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from storehelpers import delivery, flush, message, session

from appliance.store import SqliteStore, StoreError


def visible_seqs(path, client_id: str) -> set[int]:
    """Queue seqs of `client_id` as a second, independent connection sees them."""
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT seq FROM queue WHERE client_id = ?", (client_id,))}
    finally:
        conn.close()


async def test_callback_sees_its_rows_from_another_connection(make_store):
    store = make_store()
    store.start()  # picks up the running loop
    loop_thread = threading.get_ident()
    checks: list[tuple[int, bool, bool]] = []
    done = asyncio.Event()
    total = 400

    def on_commit(seq: int) -> None:
        seen = visible_seqs(store.path, "c")
        checks.append((seq, set(range(1, seq + 1)) <= seen, threading.get_ident() == loop_thread))
        if seq == total:
            done.set()

    for seq in range(1, total + 1):
        store.enqueue("c", delivery(seq, message(f"m{seq}")))
        store.after_commit(on_commit, seq)
        if seq % 37 == 0:
            await asyncio.sleep(0)  # let commits interleave with new writes
    await asyncio.wait_for(done.wait(), 60)
    assert [c[0] for c in checks] == list(range(1, total + 1))  # registration order
    assert all(ok for _, ok, _ in checks), "a callback ran before its row was committed"
    assert all(on_loop for _, _, on_loop in checks), "a callback ran off the event loop thread"
    assert store.stats()["commits"] >= 1


async def test_callback_registered_with_nothing_pending_still_runs(make_store):
    store = make_store()
    store.start()
    fut = asyncio.get_running_loop().create_future()
    store.after_commit(fut.set_result, "ran")
    assert await asyncio.wait_for(fut, 30) == "ran"
    assert store.stats()["commits"] == 0  # no transaction was needed


async def test_raising_callback_does_not_stop_the_next(make_store):
    store = make_store()
    store.start()
    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    fut = loop.create_future()

    def boom() -> None:
        raise ValueError("callback bug")

    store.set_meta("k", "v")
    store.after_commit(boom)
    store.after_commit(fut.set_result, True)
    assert await asyncio.wait_for(fut, 30)
    assert isinstance(errors[0]["exception"], ValueError)


async def test_async_close_commits_pending_and_runs_callbacks_first(make_store):
    store = make_store()
    ran: list[int] = []
    for seq in range(1, 101):
        store.enqueue("c", delivery(seq, message(f"m{seq}")))
        store.after_commit(ran.append, seq)
    store.start()
    await store.async_close()
    assert ran == list(range(1, 101))
    assert visible_seqs(store.path, "c") == set(range(1, 101))


def test_close_without_start_commits_what_was_queued(make_store):
    store = make_store()
    store.save_session(session("c"))
    store.enqueue("c", delivery(1, message("m")))
    store.close()
    assert [d.seq for d in SqliteStore(store.path).load().queues["c"]] == [1]


def test_writes_after_close_are_refused(make_store):
    store = make_store()
    store.start()
    flush(store)
    store.close()
    try:
        store.set_meta("k", "v")
    except StoreError as exc:
        assert "closed" in str(exc)
    else:
        raise AssertionError("write after close was accepted")


def test_stats_count_commits_ops_and_batches(make_store):
    store = make_store()
    for seq in range(1, 51):
        store.enqueue("c", delivery(seq, message(f"m{seq}")))
    store.start()
    flush(store)
    store.set_meta("a", "b")
    flush(store)
    stats = store.stats()
    assert stats["commits"] == 2 and stats["ops"] == 51
    assert stats["batch_last"] == 1 and stats["batch_max"] == 50 and stats["batch_mean"] == 25.5
    assert stats["commit_latency_p99_ms"] > 0 and stats["commit_latency_max_ms"] >= stats["commit_latency_p99_ms"]
    assert stats["pending"] == 0 and stats["failed"] == 0 and stats["callbacks"] == 2
