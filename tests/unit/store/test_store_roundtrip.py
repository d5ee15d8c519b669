"""Every Store write survives close + reopen and comes back from load() field for field."""

from __future__ import annotations

from storehelpers import delivery, flush, message, options, session

from appliance.broker.model import DeliveryState
from appliance.protocol.packets import Properties, Will
from appliance.store import SqliteStore


def reopen(store: SqliteStore):
    """Close the store and load a fresh instance on the same file."""
    store.close()
    return SqliteStore(store.path).load()


def test_empty_store_loads_empty(make_store):
    snap = make_store().load()
    assert (snap.sessions, snap.queues, snap.retained, snap.incoming_qos2, snap.meta) == ({}, {}, {}, {}, {})


def test_session_with_will_and_subscriptions_round_trips(make_store):
    store = make_store()
    store.start()
    rec = session("c1", protocol_version=5, expiry_interval=120, username=None)
    store.save_session(rec)
    store.save_subscription(
        "c1", "a/+/c", options(2, no_local=True, retain_as_published=True, retain_handling=2, subscription_id=77)
    )
    store.save_subscription("c1", "$share/g/x/#", options(0))
    store.save_session(session("c3", protocol_version=4, will=None, will_due_at=None, disconnected_at=None))
    flush(store)
    snap = reopen(store)
    got = snap.sessions["c1"]
    assert got.client_id == "c1" and got.protocol_version == 5 and got.expiry_interval == 120
    assert got.disconnected_at == rec.disconnected_at and got.will_due_at == rec.will_due_at
    assert got.username is None
    assert got.will == Will("will/c1", b"gone\x00", 1, True, Properties(will_delay_interval=30))
    assert got.subscriptions == {
        "a/+/c": options(2, no_local=True, retain_as_published=True, retain_handling=2, subscription_id=77),
        "$share/g/x/#": options(0),
    }
    c3 = snap.sessions["c3"]
    assert c3.will is None and c3.disconnected_at is None and c3.protocol_version == 4 and c3.subscriptions == {}


def test_queue_round_trips_in_seq_order_with_inflight_state(make_store):
    store = make_store()
    store.start()
    store.save_session(session("sub"))
    rich = message("m-rich", "t/1", payload=bytes(range(256)), qos=2, rich=True)
    plain = message("m-plain", "t/2", payload=b"")
    store.enqueue("sub", delivery(3, plain, qos=1, retain=True))
    store.enqueue("sub", delivery(1, rich, qos=2, subscription_ids=[5, 9]))
    store.enqueue("sub", delivery(2, rich, qos=1, packet_id=11, state=DeliveryState.SENT, attempts=2))
    store.enqueue("other", delivery(1, plain, qos=0))
    flush(store)
    store.update_delivery("sub", 1, DeliveryState.RELEASED, 42)
    store.update_delivery("sub", 3, DeliveryState.SENT, 7)
    flush(store)
    snap = reopen(store)
    q = snap.queues["sub"]
    assert [d.seq for d in q] == [1, 2, 3]
    assert (q[0].state, q[0].packet_id, q[0].qos, q[0].subscription_ids) == (DeliveryState.RELEASED, 42, 2, [5, 9])
    assert (q[1].state, q[1].packet_id, q[1].attempts) == (DeliveryState.SENT, 11, 2)
    assert (q[2].state, q[2].packet_id, q[2].retain, q[2].subscription_ids) == (DeliveryState.SENT, 7, True, [])
    assert q[0].message == rich and q[2].message == plain
    assert q[0].message.properties.user_properties == [("k", "v1"), ("k", "v2"), ("ünï", "çødé")]
    assert q[0].message is q[1].message  # one object per msg_id after load
    assert [d.seq for d in snap.queues["other"]] == [1]
    assert snap.sessions["sub"].next_seq == 4  # raised above the highest queued seq


def test_remove_delivery_and_delete_subscription(make_store):
    store = make_store()
    store.start()
    store.save_session(session("c"))
    store.save_subscription("c", "a", options())
    store.save_subscription("c", "b", options())
    for seq in (1, 2, 3):
        store.enqueue("c", delivery(seq, message(f"m{seq}")))
    flush(store)
    store.remove_delivery("c", 2)
    store.delete_subscription("c", "a")
    store.remove_delivery("c", 99)  # absent: harmless
    flush(store)
    snap = reopen(store)
    assert [d.seq for d in snap.queues["c"]] == [1, 3]
    assert list(snap.sessions["c"].subscriptions) == ["b"]


def test_delete_session_removes_everything_of_that_client_only(make_store):
    store = make_store()
    store.start()
    for cid in ("gone", "kept"):
        store.save_session(session(cid))
        store.save_subscription(cid, "x/#", options())
        store.enqueue(cid, delivery(1, message("m1")))
        store.save_incoming_qos2(cid, 5, message("q2"))
    flush(store)
    store.delete_session("gone")
    flush(store)
    snap = reopen(store)
    assert set(snap.sessions) == {"kept"} and set(snap.queues) == {"kept"} and set(snap.incoming_qos2) == {"kept"}
    assert list(snap.sessions["kept"].subscriptions) == ["x/#"]


def test_retained_round_trip_replace_and_delete(make_store):
    store = make_store()
    store.start()
    first = message("r1", "status/a", payload=b"on", qos=1, rich=True)
    first.retain = True
    second = message("r2", "status/a", payload=b"off", qos=0)
    second.retain = True
    other = message("r3", "status/b")
    other.retain = True
    store.save_retained(first)
    store.save_retained(other)
    flush(store)
    store.save_retained(second)
    store.delete_retained("status/b")
    store.delete_retained("never/there")
    flush(store)
    snap = reopen(store)
    assert snap.retained == {"status/a": second}


def test_incoming_qos2_with_and_without_message(make_store):
    store = make_store()
    store.start()
    held = message("q2-1", "in/x", qos=2, rich=True)
    store.save_incoming_qos2("pub", 1, held)
    store.save_incoming_qos2("pub", 2, None)
    store.save_incoming_qos2("pub", 3, message("q2-3", qos=2))
    flush(store)
    store.save_incoming_qos2("pub", 1, None)  # routed: keep the packet id, drop the message
    store.delete_incoming_qos2("pub", 3)
    flush(store)
    snap = reopen(store)
    assert snap.incoming_qos2 == {"pub": {1: None, 2: None}}


def test_meta_set_and_overwrite(make_store):
    store = make_store()
    store.start()
    store.set_meta("node_id", "n-1")
    store.set_meta("counter", "1")
    store.set_meta("counter", "2")
    flush(store)
    assert reopen(store).meta == {"node_id": "n-1", "counter": "2"}


def test_session_fields_overwrite_on_save(make_store):
    store = make_store()
    store.start()
    store.save_session(session("c", next_seq=1))
    store.save_subscription("c", "s", options())
    flush(store)
    store.save_session(session("c", next_seq=50, will=None, will_due_at=None, disconnected_at=None))
    flush(store)
    snap = reopen(store)
    got = snap.sessions["c"]
    assert (got.next_seq, got.will, got.will_due_at, got.disconnected_at) == (50, None, None, None)
    assert list(got.subscriptions) == ["s"]  # save_session leaves subscriptions alone
