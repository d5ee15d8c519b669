"""WAL checkpoints run off the writer thread; a WAL that outgrows them is restarted by the writer; no data is lost."""

from __future__ import annotations

import time

from storehelpers import delivery, flush, message

from appliance.store import SqliteStore, checkpoint
from appliance.store.sqlite import CHECKPOINT_EVERY_COMMITS


def wait_for(predicate, timeout: float = 60.0) -> bool:
    """Poll `predicate` until true or `timeout` (a bound, not a measured figure)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_background_checkpoints_keep_every_row(make_store):
    store = make_store()
    store.start()
    rows = 2 * CHECKPOINT_EVERY_COMMITS + 1
    for seq in range(1, rows + 1):
        store.enqueue("c", delivery(seq, message(f"m{seq}", payload=b"w" * 2000)))
        flush(store)  # one commit per row
    assert wait_for(lambda: store.stats()["checkpoints"] >= 1), "the checkpointer never ran"
    assert store.stats()["checkpoint_errors"] == 0
    store.close()
    assert [d.seq for d in SqliteStore(store.path).load().queues["c"]] == list(
        range(1, 2 * CHECKPOINT_EVERY_COMMITS + 2)
    )


def test_writer_restarts_a_wal_that_outgrew_passive_checkpoints(make_store, monkeypatch):
    monkeypatch.setattr(checkpoint, "WAL_FRAMES_HIGH", 1)
    store = make_store()
    store.start()
    seq = 0
    while store.stats()["wal_restarts"] == 0 and seq < 5000:
        seq += 1
        store.enqueue("c", delivery(seq, message(f"m{seq}", payload=b"w" * 500)))
        flush(store)
    assert store.stats()["wal_restarts"] >= 1
    for more in range(seq + 1, seq + 50):
        store.enqueue("c", delivery(more, message(f"m{more}")))
    flush(store)
    store.close()
    assert [d.seq for d in SqliteStore(store.path).load().queues["c"]] == list(range(1, seq + 50))
