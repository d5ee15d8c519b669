"""DVVSet: merge laws (hypothesis), update/sync causality, siblings, tombstone GC, resolution, encoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.cluster import dvv
from appliance.cluster.dvv import EMPTY, DVVError, DVVSet, Entry

NODES = ["a", "b", "c"]

# One step of a simulated cluster: ("w", node, value, stale) writes at `node` with the context it read `stale` steps
# ago (0 = its current clock); ("d", node) deletes with a current read; ("s", x, y) has x pull y's state.
step = st.one_of(
    st.tuples(st.just("w"), st.sampled_from(NODES), st.binary(max_size=3), st.integers(0, 2)),
    st.tuples(st.just("d"), st.sampled_from(NODES)),
    st.tuples(st.just("s"), st.sampled_from(NODES), st.sampled_from(NODES)),
)


def run_history(steps: list[tuple]) -> list[DVVSet]:
    """Play a history through real update/sync calls; return every clock that any replica held."""
    state = {n: EMPTY for n in NODES}
    past: dict[str, list[DVVSet]] = {n: [EMPTY] for n in NODES}
    counters = dict.fromkeys(NODES, 0)
    seen: list[DVVSet] = [EMPTY]
    for s in steps:
        if s[0] == "w":
            _, node, value, stale = s
            ctx_clock = past[node][-1 - min(stale, len(past[node]) - 1)]
            state[node] = dvv.update(state[node], dvv.join(ctx_clock), value, node, counters[node])
        elif s[0] == "d":
            node = s[1]
            state[node] = dvv.delete(state[node], dvv.join(state[node]), node, counters[node])
        else:
            _, node, other = s
            state[node] = dvv.sync(state[node], state[other])
        counters[node] = max(counters[node], dvv.dot_of_last_write(state[node], node))
        past[node].append(state[node])
        seen.append(state[node])
    return seen


histories = st.lists(step, max_size=25).map(run_history)


@st.composite
def three_clocks(draw: st.DrawFn) -> tuple[DVVSet, DVVSet, DVVSet]:
    """Three clocks taken from one consistent history (so equal dots carry equal values)."""
    seen = draw(histories)
    return draw(st.sampled_from(seen)), draw(st.sampled_from(seen)), draw(st.sampled_from(seen))


@settings(max_examples=300, deadline=None)
@given(three_clocks())
def test_sync_is_commutative_associative_idempotent(clocks: tuple[DVVSet, DVVSet, DVVSet]) -> None:
    a, b, c = clocks
    assert dvv.sync(a, b) == dvv.sync(b, a)
    assert dvv.sync(dvv.sync(a, b), c) == dvv.sync(a, dvv.sync(b, c))
    assert dvv.sync(a, a) == a
    assert dvv.sync(a, dvv.sync(a, b)) == dvv.sync(a, b)


@settings(max_examples=200, deadline=None)
@given(three_clocks(), st.sampled_from(NODES), st.binary(max_size=3))
def test_update_then_sync_dominates(clocks: tuple[DVVSet, DVVSet, DVVSet], node: str, value: bytes) -> None:
    base, _, _ = clocks
    newer = dvv.update(base, dvv.join(base), value, node)
    assert dvv.less(base, newer)
    assert dvv.sync(base, newer) == newer
    assert dvv.values(newer, tombstones=True) == [value]  # a write with a full context leaves no siblings


@settings(max_examples=200, deadline=None)
@given(three_clocks(), st.binary(max_size=3), st.binary(max_size=3))
def test_concurrent_updates_are_kept_as_siblings(clocks: tuple[DVVSet, DVVSet, DVVSet], v1: bytes, v2: bytes) -> None:
    base, _, _ = clocks
    ctx = dvv.join(base)
    at_a = dvv.update(base, ctx, v1, "a")
    at_b = dvv.update(base, ctx, v2, "b")
    assert dvv.concurrent(at_a, at_b)
    merged = dvv.sync(at_a, at_b)
    assert sorted(dvv.values(merged, tombstones=True)) == sorted([v1, v2])
    assert dvv.resolve(merged) == max(v1, v2)  # the same winner whichever way round the merge ran
    assert dvv.resolve(dvv.sync(at_b, at_a)) == dvv.resolve(merged)


@settings(max_examples=200, deadline=None)
@given(histories)
def test_encoding_round_trips(seen: list[DVVSet]) -> None:
    for clock in seen:
        assert dvv.decode(dvv.encode(clock)) == clock
        vv = dvv.join(clock)
        assert dvv.decode_vv(dvv.encode_vv(vv)) == vv


def test_stale_write_keeps_sibling_and_later_full_write_replaces_both() -> None:
    c1 = dvv.update(EMPTY, {}, b"x", "a")
    c2 = dvv.update(c1, {}, b"y", "a")  # written without having read x: concurrent with it
    assert sorted(dvv.values(c2)) == [b"x", b"y"]
    c3 = dvv.update(c2, dvv.join(c2), b"z", "b")
    assert dvv.values(c3) == [b"z"]
    assert dvv.join(c3) == {"a": 2, "b": 1}


def test_sync_with_older_replica_drops_overwritten_value() -> None:
    old = dvv.update(EMPTY, {}, b"v1", "a")
    new = dvv.update(old, dvv.join(old), b"v2", "b")
    assert dvv.values(dvv.sync(old, new)) == [b"v2"]
    assert dvv.values(dvv.sync(new, old)) == [b"v2"]


def test_delete_concurrent_with_write_resolves_add_wins() -> None:
    base = dvv.update(EMPTY, {}, b"sub", "a")
    deleted = dvv.delete(base, dvv.join(base), "a")
    rewritten = dvv.update(base, dvv.join(base), b"sub2", "b")
    merged = dvv.sync(deleted, rewritten)
    assert dvv.values(merged, tombstones=True) == [None, b"sub2"]
    assert dvv.resolve(merged) == b"sub2"
    assert not dvv.is_deleted(merged)
    assert dvv.is_deleted(deleted) and dvv.resolve(deleted) is None


def test_resolve_with_order_key_prefers_highest_key() -> None:
    base = EMPTY
    a = dvv.update(base, {}, b"\x00\x09zz", "a")  # 2-byte big-endian "timestamp" prefix 9
    b = dvv.update(base, {}, b"\x00\x0aaa", "b")  # prefix 10
    merged = dvv.sync(a, b)
    assert dvv.resolve(merged, order_key=lambda v: v[:2]) == b"\x00\x0aaa"
    assert dvv.resolve(merged, order_key=lambda v: v[2:]) == b"\x00\x09zz"


def test_tombstone_collectable_only_when_every_member_has_seen_it() -> None:
    c = dvv.update(EMPTY, {}, b"v", "a")
    c = dvv.delete(c, dvv.join(c), "b")
    full = dvv.join(c)
    assert dvv.collectable(c, [full, full, full])
    assert not dvv.collectable(c, [full, full, {"a": 1}])  # one member has not seen the delete yet
    live = dvv.update(c, {}, b"again", "c")  # a concurrent write revives the key: never collectable
    assert not dvv.collectable(live, [dvv.join(live)] * 3)


def test_floor_keeps_dots_unique_after_gc_and_rewrite() -> None:
    # Node a writes, deletes, the key is collected everywhere except on a lagging replica still holding the tombstone.
    c = dvv.update(EMPTY, {}, b"v", "a", floor=0)
    c = dvv.delete(c, dvv.join(c), "a", floor=dvv.dot_of_last_write(c, "a"))
    lagging = c
    node_counter = dvv.dot_of_last_write(c, "a")  # a's node-wide counter, persisted by the store
    rewritten = dvv.update(EMPTY, {}, b"new", "a", floor=node_counter)
    assert dvv.values(dvv.sync(lagging, rewritten)) == [b"new"]
    without_floor = dvv.update(EMPTY, {}, b"new", "a")
    assert dvv.values(dvv.sync(lagging, without_floor)) == []  # what the floor prevents: the rewrite is lost


def test_update_with_context_from_unknown_node_records_it_as_seen() -> None:
    c = dvv.update(EMPTY, {"z": 4}, b"v", "a")
    assert dvv.join(c) == {"a": 1, "z": 4}
    other = DVVSet((Entry("z", 4, ((4, b"old"),)),))
    assert dvv.values(dvv.sync(c, other)) == [b"v"]


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x02", b"\x01\x01", b"\x01\x01\x01a\x05\x01\x06\x00", b"\x01\x01\x01\xff", b"\x01\x00extra"],
)
def test_decode_rejects_bad_bytes(raw: bytes) -> None:
    with pytest.raises(DVVError):
        dvv.decode(raw)


def test_invariants_checked_on_construction() -> None:
    with pytest.raises(DVVError):
        DVVSet((Entry("b", 1), Entry("a", 1)))
    with pytest.raises(DVVError):
        DVVSet((Entry("a", 2, ((1, b"x"), (2, b"y"))),))
    with pytest.raises(DVVError):
        DVVSet((Entry("a", 1, ((3, b"x"),)),))


def test_encoding_is_compact() -> None:
    c = dvv.update(EMPTY, {}, b"q1", "node-1")
    assert len(dvv.encode(c)) == 1 + 1 + 7 + 1 + 1 + 1 + 1 + 2
