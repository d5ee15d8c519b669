"""ClusterStore on a real SqliteStore: callbacks wait for the local commit and the peer acks registered before
them, client acks keep FIFO order, cluster-internal acks do not queue behind them, a down peer releases per policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

from appliance.server.cluster_store import ClusterStore
from appliance.store import SqliteStore


async def _open(tmp_path: Path) -> ClusterStore:
    inner = SqliteStore(tmp_path / "broker.db")
    inner.open()
    inner.load()
    inner.start(asyncio.get_running_loop())
    return ClusterStore(inner)


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0.01)


async def test_ack_waits_for_commit_and_peer_and_keeps_fifo_order(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    ran: list[str] = []
    store.inner.kv_put("fwd/nb", "1", b"x")
    store.add_wait("nb", 1, "f")
    store.after_commit(ran.append, "puback-1")  # gated on nb's ack of seq 1
    store.after_commit(ran.append, "puback-2")  # nothing of its own, but must not overtake puback-1
    await _settle()
    assert ran == []
    assert store.gated == 2
    store.wait_done("nb", 1, "f")
    await _settle()
    assert ran == ["puback-1", "puback-2"]
    assert store.gated == 0
    store.after_commit(ran.append, "puback-3")  # fast path again
    await _settle()
    assert ran[-1] == "puback-3"
    await store.inner.async_close()
    assert SqliteStore(tmp_path / "broker.db").load_kv() == {"fwd/nb": {"1": b"x"}}


async def test_internal_ack_does_not_wait_behind_client_acks(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    ran: list[str] = []
    store.add_wait("nb", 7, "f")
    store.after_commit(ran.append, "puback")  # waits for nb
    store.begin_own_acks()
    store.add_wait("nc", 3, "r")
    store.after_own_acks(ran.append, "forward-ack")  # waits for nc only
    store.wait_done("nc", 3, "r")
    await _settle()
    assert ran == ["forward-ack"]  # two nodes waiting on each other's client acks would deadlock otherwise
    store.wait_done("nb", 7, "f")
    await _settle()
    assert ran == ["forward-ack", "puback"]
    await store.inner.async_close()


async def test_peer_down_releases_only_the_waits_of_that_stream(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    ran: list[str] = []
    store.add_wait("nb", 1, "f")
    store.add_wait("nb", 2, "r")
    store.after_commit(ran.append, "puback")
    store.peer_down("nb", "f")
    await _settle()
    assert ran == []  # the replica write to nb is still outstanding
    store.peer_down("nb", "r")
    await _settle()
    assert ran == ["puback"]
    store.wait_done("nb", 1, "f")  # a late ack after the release is harmless
    await store.inner.async_close()


async def test_ack_before_binding_counts(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    ran: list[str] = []
    store.add_wait("nb", 5, "r")
    store.wait_done("nb", 5, "r")  # acked before any callback was registered
    store.after_commit(ran.append, "suback")
    await _settle()
    assert ran == ["suback"] and store.gated == 0
    await store.inner.async_close()


async def test_internal_ack_keeps_its_waits_when_a_client_ack_took_them_too(tmp_path: Path) -> None:
    store = await _open(tmp_path)
    ran: list[str] = []
    store.begin_own_acks()  # a forward arrives: its enqueue is replicated to nc ...
    store.add_wait("nc", 1, "r")
    store.after_commit(ran.append, "qos2-send")  # ... and the broker registers a callback of its own in between
    store.after_own_acks(ran.append, "forward-ack")
    await _settle()
    assert ran == []  # the forward's ack must not go out before the replica has the message
    store.wait_done("nc", 1, "r")
    await _settle()
    assert sorted(ran) == ["forward-ack", "qos2-send"]
    await store.inner.async_close()
