"""Group commit applies a batch in call order: same-batch insert/remove, delete/re-create, and a random model check."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storehelpers import delivery, flush, message, options, session

from appliance.broker.model import DeliveryState
from appliance.store import SqliteStore


def one_batch(store: SqliteStore) -> None:
    """Start the writer after the ops were queued, so they all land in one transaction, and wait for it."""
    before = store.stats()["commits"]
    store.start()
    flush(store)
    assert store.stats()["commits"] == before + 1, "expected exactly one transaction"


def test_insert_then_remove_in_one_batch_leaves_nothing(make_store):
    store = make_store()
    store.save_session(session("c"))
    store.enqueue("c", delivery(1, message("m1")))
    store.update_delivery("c", 1, DeliveryState.SENT, 1)
    store.enqueue("c", delivery(2, message("m2")))
    store.remove_delivery("c", 1)
    one_batch(store)
    store.close()
    assert [d.seq for d in SqliteStore(store.path).load().queues["c"]] == [2]
    assert store.stats()["ops_elided"] == 2  # the enqueue and the update of seq 1 were never written


def test_remove_then_reinsert_same_seq_keeps_the_last(make_store):
    store = make_store()
    store.enqueue("c", delivery(1, message("old")))
    store.remove_delivery("c", 1)
    store.enqueue("c", delivery(1, message("new")))
    store.update_delivery("c", 1, DeliveryState.SENT, 9)
    one_batch(store)
    store.close()
    (only,) = SqliteStore(store.path).load().queues["c"]
    assert (only.message.msg_id, only.state, only.packet_id) == ("new", DeliveryState.SENT, 9)


def test_delete_session_then_recreate_in_one_batch(make_store):
    store = make_store()
    store.start()
    store.save_session(session("c", username="old"))
    store.save_subscription("c", "old/#", options())
    store.enqueue("c", delivery(1, message("m-old")))
    store.save_incoming_qos2("c", 3, None)
    flush(store)
    store.close()
    store = make_store()
    store.delete_session("c")
    store.save_session(session("c", username="new"))
    store.save_subscription("c", "new/#", options(2))
    store.enqueue("c", delivery(1, message("m-new")))
    one_batch(store)
    store.close()
    snap = SqliteStore(store.path).load()
    assert snap.sessions["c"].username == "new"
    assert snap.sessions["c"].subscriptions == {"new/#": options(2)}
    assert [d.message.msg_id for d in snap.queues["c"]] == ["m-new"]
    assert "c" not in snap.incoming_qos2


def test_recreate_then_delete_in_one_batch_leaves_nothing(make_store):
    store = make_store()
    store.save_session(session("c"))
    store.save_subscription("c", "x", options())
    store.enqueue("c", delivery(1, message("m")))
    store.delete_session("c")
    one_batch(store)
    store.close()
    snap = SqliteStore(store.path).load()
    assert (snap.sessions, snap.queues) == ({}, {})


def test_batch_max_splits_into_several_transactions(make_store):
    store = make_store(batch_max=10)
    for seq in range(1, 36):
        store.enqueue("c", delivery(seq, message(f"m{seq}")))
    store.start()
    flush(store)
    stats = store.stats()
    assert stats["commits"] == 4 and stats["batch_max"] == 10 and stats["ops"] == 35
    store.close()
    assert [d.seq for d in SqliteStore(store.path).load().queues["c"]] == list(range(1, 36))


# -- model check: random op sequences, random batch boundaries, compared with a dict model -----------------------

CLIENTS = ["a", "b"]
op_strategy = st.one_of(
    st.tuples(st.just("enqueue"), st.sampled_from(CLIENTS), st.integers(1, 6), st.integers(0, 3)),
    st.tuples(st.just("update"), st.sampled_from(CLIENTS), st.integers(1, 6), st.sampled_from(list(DeliveryState))),
    st.tuples(st.just("remove"), st.sampled_from(CLIENTS), st.integers(1, 6)),
    st.tuples(st.just("save_session"), st.sampled_from(CLIENTS), st.integers(1, 9)),
    st.tuples(st.just("delete_session"), st.sampled_from(CLIENTS)),
    st.tuples(st.just("sub"), st.sampled_from(CLIENTS), st.sampled_from(["f1", "f2"]), st.integers(0, 2)),
    st.tuples(st.just("unsub"), st.sampled_from(CLIENTS), st.sampled_from(["f1", "f2"])),
    st.tuples(st.just("flush")),
)


def _apply_model(model: dict, op: tuple) -> None:
    kind = op[0]
    if kind == "enqueue":
        model["queue"][(op[1], op[2])] = (f"m{op[3]}", DeliveryState.QUEUED, None)
    elif kind == "update" and (op[1], op[2]) in model["queue"]:
        msg_id, _, _ = model["queue"][(op[1], op[2])]
        model["queue"][(op[1], op[2])] = (msg_id, op[3], op[2] + 100)
    elif kind == "remove":
        model["queue"].pop((op[1], op[2]), None)
    elif kind == "save_session":
        model["sessions"][op[1]] = op[2]
    elif kind == "delete_session":
        model["sessions"].pop(op[1], None)
        model["subs"] = {k: v for k, v in model["subs"].items() if k[0] != op[1]}
        model["queue"] = {k: v for k, v in model["queue"].items() if k[0] != op[1]}
    elif kind == "sub":
        model["subs"][(op[1], op[2])] = op[3]
    elif kind == "unsub":
        model["subs"].pop((op[1], op[2]), None)


def _apply_store(store: SqliteStore, op: tuple) -> None:
    kind = op[0]
    if kind == "enqueue":
        store.enqueue(op[1], delivery(op[2], message(f"m{op[3]}")))
    elif kind == "update":
        store.update_delivery(op[1], op[2], op[3], op[2] + 100)
    elif kind == "remove":
        store.remove_delivery(op[1], op[2])
    elif kind == "save_session":
        store.save_session(session(op[1], next_seq=op[2]))
    elif kind == "delete_session":
        store.delete_session(op[1])
    elif kind == "sub":
        store.save_subscription(op[1], op[2], options(op[3]))
    elif kind == "unsub":
        store.delete_subscription(op[1], op[2])
    elif kind == "flush":
        store.start()  # the first flush starts the writer: everything before it is one batch
        flush(store)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_strategy, max_size=40), st.integers(1, 8))
def test_random_ops_match_a_dict_model(op_list, batch_max):
    model: dict = {"queue": {}, "sessions": {}, "subs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "s.db", batch_max=batch_max)
        store.open()
        for op in op_list:
            _apply_store(store, op)
            _apply_model(model, op)
        store.close()
        snap = SqliteStore(store.path).load()
    got_queue = {(c, d.seq): (d.message.msg_id, d.state, d.packet_id) for c, q in snap.queues.items() for d in q}
    assert got_queue == model["queue"]
    for q in snap.queues.values():
        assert [d.seq for d in q] == sorted(d.seq for d in q)
    assert set(snap.sessions) == set(model["sessions"])
    for c, next_seq in model["sessions"].items():
        highest = max((s for (cc, s) in model["queue"] if cc == c), default=0)
        assert snap.sessions[c].next_seq == max(next_seq, highest + 1)
    got_subs = {(c, f): o.qos for c, rec in snap.sessions.items() for f, o in rec.subscriptions.items()}
    assert got_subs == {k: v for k, v in model["subs"].items() if k[0] in model["sessions"]}


def test_removals_run_first_as_range_deletes_and_leave_the_right_rows(make_store):
    store = make_store()
    store.start()
    for seq in range(1, 13):
        store.enqueue("c", delivery(seq, message(f"m{seq}")))
        store.enqueue("d", delivery(seq, message(f"d{seq}")))
    flush(store)
    store.close()
    store = make_store()
    for seq in (3, 4, 5, 9, 1, 11, 12):  # acks out of order: runs 1, 3-5, 9, 11-12
        store.remove_delivery("c", seq)
    store.remove_delivery("d", 7)
    store.enqueue("c", delivery(4, message("again")))  # removed, then written again in the same batch
    store.enqueue("c", delivery(13, message("m13")))
    store.remove_delivery("c", 13)  # written and removed in one batch: never written
    one_batch(store)
    store.close()
    queues = SqliteStore(store.path).load().queues
    assert [(d.seq, d.message.msg_id) for d in queues["c"]] == [
        (2, "m2"), (4, "again"), (6, "m6"), (7, "m7"), (8, "m8"), (10, "m10")]
    assert [d.seq for d in queues["d"]] == [s for s in range(1, 13) if s != 7]


def test_queue_only_batch_keeps_every_column(make_store):
    """The one-pass path for batches of queue inserts and removals writes the same rows as the general one."""
    from appliance.protocol.packets import NO_PROPERTIES

    rich = message("m-rich", "t/1", payload=bytes(range(256)), qos=2, rich=True)
    bare = message("m-bare", "t/2", payload=b"")
    bare.properties = NO_PROPERTIES  # as decoded from a PUBLISH without properties
    store = make_store()
    store.enqueue("a", delivery(1, rich, qos=2, subscription_ids=[5, 9]))
    store.enqueue("b", delivery(1, rich, qos=1, packet_id=11, state=DeliveryState.SENT))  # fan-out: one message
    store.enqueue("a", delivery(2, bare, qos=1, retain=True, packet_id=3, state=DeliveryState.SENT))
    store.enqueue("a", delivery(3, bare))
    store.remove_delivery("a", 3)
    one_batch(store)
    assert store.stats()["ops_elided"] == 1
    store.close()
    queues = SqliteStore(store.path).load().queues
    a1, a2 = queues["a"]
    (b1,) = queues["b"]
    assert a1.message == rich and b1.message == rich and a2.message == bare
    assert a1.message.properties.user_properties == rich.properties.user_properties
    assert (a1.qos, a1.subscription_ids, a1.state, a1.packet_id) == (2, [5, 9], DeliveryState.QUEUED, None)
    assert (b1.qos, b1.state, b1.packet_id) == (1, DeliveryState.SENT, 11)
    assert (a2.retain, a2.state, a2.packet_id, a2.message.payload) == (True, DeliveryState.SENT, 3, b"")
