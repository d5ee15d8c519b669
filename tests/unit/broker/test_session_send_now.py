"""Session.enqueue of a QoS1 delivery the inflight window has room for: one store write (the row already SENT), the
PUBLISH at once; every other delivery takes the queue and pump, as before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord
from appliance.broker.session import Session
from appliance.cluster.records import decode_delivery
from appliance.protocol.packets import Packet
from appliance.server.cluster_store import ClusterStore
from appliance.store import SqliteStore
from appliance.store.loader import load_snapshot
from appliance.store.schema import connect


class RecordingStore:
    """The queue part of the Store port, recording each call with the values captured at call time."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def enqueue(self, client_id: str, delivery: Delivery) -> None:
        """Record the row as written now."""
        self.calls.append(("enqueue", delivery.seq, delivery.state, delivery.packet_id, delivery.attempts))

    def update_delivery(self, client_id: str, seq: int, state: DeliveryState, packet_id: int | None) -> None:
        """Record the update."""
        self.calls.append(("update", seq, state, packet_id))

    def remove_delivery(self, client_id: str, seq: int) -> None:
        """Record the removal."""
        self.calls.append(("remove", seq))

    def after_commit(self, callback: Any, *args: Any) -> None:
        """Record the callback (never run here)."""
        self.calls.append(("after_commit",))


class Link:
    """A ClientLink recording (packet id, qos, dup) of each PUBLISH."""

    protocol_version = 4

    def __init__(self) -> None:
        self.published: list[tuple[int | None, int, bool]] = []

    def send(self, packet: Packet) -> None:
        """Ignore other packets."""

    def publish(self, message: Message, qos: int, retain: bool, packet_id: int | None, dup: bool,
                subscription_ids: list[int]) -> bool:
        """Record the PUBLISH."""
        self.published.append((packet_id, qos, dup))
        return True

    def close(self, reason_code: int | None = None) -> None:
        """Ignore."""


def _message(qos: int = 1, expiry_at: float | None = None) -> Message:
    return Message("m", "t", b"x", qos, False, "pub", 1000.0, expiry_at)


def _session(store: Any, window: int = 10) -> tuple[Session, Link]:
    session = Session(SessionRecord("sub", 4, 0xFFFFFFFF), store, clock=lambda: 1000.0)
    link = Link()
    session.link = link
    session.receive_maximum = window
    return session, link


def test_qos1_with_room_is_written_sent_once_and_published() -> None:
    store = RecordingStore()
    session, link = _session(store)
    delivery = Delivery(session.next_seq(), _message(), 1, False)
    session.enqueue(delivery)
    assert store.calls == [("enqueue", 1, DeliveryState.SENT, 1, 0)]  # attempts as pump's enqueue + update left it
    assert link.published == [(1, 1, False)]
    assert session.inflight == {1: delivery} and not session.queue
    assert delivery.attempts == 1 and delivery.state is DeliveryState.SENT


def test_full_window_queues_then_pump_sends_on_puback() -> None:
    store = RecordingStore()
    session, link = _session(store, window=1)
    first = Delivery(session.next_seq(), _message(), 1, False)
    second = Delivery(session.next_seq(), _message(), 1, False)
    session.enqueue(first)
    session.enqueue(second)
    assert store.calls[1:] == [("enqueue", 2, DeliveryState.QUEUED, None, 0)]
    assert link.published == [(1, 1, False)] and list(session.queue) == [second]
    session.complete(1)
    assert store.calls[2:] == [("remove", 1), ("update", 2, DeliveryState.SENT, 2)]
    assert link.published[1:] == [(2, 1, False)]


def test_behind_a_waiting_delivery_keeps_the_order() -> None:
    store = RecordingStore()
    session, link = _session(store, window=1)
    session.enqueue(Delivery(session.next_seq(), _message(), 1, False))
    session.enqueue(Delivery(session.next_seq(), _message(), 1, False))
    session.receive_maximum = 10  # room now, but seq 2 waits in the queue: seq 3 must not overtake it
    third = Delivery(session.next_seq(), _message(), 1, False)
    session.enqueue(third)
    assert store.calls[2] == ("enqueue", 3, DeliveryState.QUEUED, None, 0)
    assert [pid for pid, _, _ in link.published] == [1, 2, 3]  # pump sent seq 2 first, then seq 3


def test_expired_and_qos2_take_the_queue() -> None:
    store = RecordingStore()
    session, link = _session(store)
    session.enqueue(Delivery(session.next_seq(), _message(expiry_at=999.0), 1, False))
    assert store.calls == [("enqueue", 1, DeliveryState.QUEUED, None, 0), ("remove", 1)]
    assert link.published == []
    store.calls.clear()
    session.enqueue(Delivery(session.next_seq(), _message(qos=2), 2, False))
    assert store.calls == [("enqueue", 2, DeliveryState.QUEUED, None, 0), ("update", 2, DeliveryState.SENT, 1),
                           ("after_commit",)]  # QoS2: the PUBLISH waits for the commit of its packet id
    assert link.published == []


def test_offline_session_queues() -> None:
    store = RecordingStore()
    session = Session(SessionRecord("sub", 4, 0xFFFFFFFF), store, clock=lambda: 1000.0)  # type: ignore[arg-type]
    session.enqueue(Delivery(session.next_seq(), _message(), 1, False))
    assert store.calls == [("enqueue", 1, DeliveryState.QUEUED, None, 0)]


async def test_row_on_disk_and_replica_copy(tmp_path: Path) -> None:
    inner = SqliteStore(tmp_path / "broker.db")
    inner.open()
    inner.load()
    inner.start(asyncio.get_running_loop())
    store = ClusterStore(inner)
    replicated: list[bytes] = []
    store.on_session_op = lambda client_id, op, data, acked: replicated.append(data)
    session, _link = _session(store)
    session.enqueue(Delivery(session.next_seq(), _message(), 1, False))
    await inner.async_close()
    conn = connect(tmp_path / "broker.db")
    try:
        (row,) = load_snapshot(conn).queues["sub"]
    finally:
        conn.close()
    assert (row.seq, row.state, row.packet_id, row.attempts) == (1, DeliveryState.SENT, 1, 0)
    copy = decode_delivery(replicated[0])  # replicas keep a QoS1 delivery queued, as before (no SENT replication)
    assert (copy.seq, copy.state, copy.packet_id) == (1, DeliveryState.QUEUED, None)
