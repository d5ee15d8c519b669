"""Replicated key spaces: random writes under partitions, then anti-entropy converges every node; tombstone GC."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.cluster import dvv
from appliance.cluster.replicated import ReplicatedSpace

NODES = ["a", "b", "c"]


def exchange(x: ReplicatedSpace, y: ReplicatedSpace) -> None:
    """One anti-entropy round x -> y, the way two linked nodes run it (digest, plan, repair both ways)."""
    entries, collected = x.digest()
    y.observe_digest(x.node_id, entries, collected)
    plan = y.plan_repair(entries, complete=True, collected=collected)
    x.merge_many(y.clocks_for(plan.push))
    y.merge_many(x.clocks_for(plan.request))


def converged(spaces: list[ReplicatedSpace]) -> bool:
    first = spaces[0].clocks()
    return all(s.clocks() == first for s in spaces[1:])


step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(NODES), st.sampled_from(["k1", "k2", "k3"]), st.binary(max_size=2)),
    st.tuples(st.just("del"), st.sampled_from(NODES), st.sampled_from(["k1", "k2", "k3"])),
    st.tuples(st.just("sync"), st.sampled_from(NODES), st.sampled_from(NODES)),
    st.tuples(st.just("split"), st.sampled_from(NODES), st.sampled_from(NODES)),
    st.tuples(st.just("heal"),),
    st.tuples(st.just("gc"), st.sampled_from(NODES)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=40), st.randoms(use_true_random=False))
def test_any_history_converges_after_heal_and_gc_never_loses_a_live_key(steps, rnd: random.Random) -> None:
    spaces = {n: ReplicatedSpace("subs", n) for n in NODES}
    split: set[frozenset[str]] = set()
    now = 0.0
    for s in steps:
        now += 1
        if s[0] == "put":
            spaces[s[1]].put(s[2], s[3])
        elif s[0] == "del":
            spaces[s[1]].delete(s[2])
        elif s[0] == "sync" and s[1] != s[2] and frozenset((s[1], s[2])) not in split:
            exchange(spaces[s[1]], spaces[s[2]])
        elif s[0] == "split" and s[1] != s[2]:
            split.add(frozenset((s[1], s[2])))
        elif s[0] == "heal":
            split.clear()
        elif s[0] == "gc":
            spaces[s[1]].collect_garbage(NODES, now)
    # Heal everything and run anti-entropy rounds in a random order until quiet.
    order = [(x, y) for x in NODES for y in NODES if x != y]
    for _ in range(3):
        rnd.shuffle(order)
        for x, y in order:
            exchange(spaces[x], spaces[y])
    assert converged(list(spaces.values()))
    live_before = spaces["a"].items()
    # GC rounds: digests carry vectors, every node collects, and the state stays identical and live keys stay.
    for _ in range(3):
        now += 1
        for x, y in order:
            exchange(spaces[x], spaces[y])
        for n in NODES:
            spaces[n].collect_garbage(NODES, now)
    assert converged(list(spaces.values()))
    assert spaces["a"].items() == live_before
    assert all(not dvv.is_deleted(c) for c in spaces["a"].clocks().values())  # every tombstone collected


def test_concurrent_writes_in_a_partition_both_survive_and_resolve_identically() -> None:
    a, b = ReplicatedSpace("retained", "a"), ReplicatedSpace("retained", "b")
    a.put("t/1", b"base")
    exchange(a, b)
    a.put("t/1", b"from-a")  # split: both sides write
    b.put("t/1", b"from-b")
    exchange(a, b)
    assert sorted(dvv.values(a.clock("t/1"))) == [b"from-a", b"from-b"]
    assert a.clock("t/1") == b.clock("t/1")
    assert a.value("t/1") == b.value("t/1") == b"from-b"


def test_stale_copy_after_gc_does_not_resurrect_the_key() -> None:
    a, b, c = (ReplicatedSpace("subs", n) for n in NODES)
    a.put("cl", b"sub")
    exchange(a, b)
    exchange(a, c)
    stale = c.clock("cl")  # a copy "in flight" from c
    a.delete("cl")
    for x, y in [(a, b), (a, c), (b, a), (c, a), (b, c), (c, b)]:
        exchange(x, y)
    for s in (a, b, c):
        assert s.collect_garbage(NODES, 1.0) == ["cl"]
    assert a.merge("cl", stale) is None  # dominated by the collected vector: ignored
    assert a.value("cl") is None and "cl" not in a.clocks()
    a.put("cl", b"again")  # a real new write after GC is kept and wins everywhere
    exchange(a, b)
    assert b.value("cl") == b"again"


def test_tombstone_is_kept_until_every_member_has_seen_it() -> None:
    a, b, c = (ReplicatedSpace("subs", n) for n in NODES)
    a.put("k", b"v")
    exchange(a, b)
    exchange(a, c)
    a.delete("k")
    exchange(a, b)
    exchange(b, a)
    assert a.collect_garbage(NODES, 1.0) == []  # c has not seen the delete
    exchange(a, c)
    exchange(c, a)
    assert a.collect_garbage(NODES, 2.0) == ["k"]
    assert c.collect_garbage(NODES, 2.0) == []  # c has not heard b's vector for the tombstone yet
    exchange(b, c)
    exchange(a, c)
    assert c.collect_garbage(NODES, 3.0) == ["k"]


def test_collected_entries_expire_after_grace() -> None:
    a, b = ReplicatedSpace("subs", "a", grace=10.0), ReplicatedSpace("subs", "b")
    a.put("k", b"v")
    a.delete("k")
    exchange(a, b)
    exchange(b, a)
    assert a.collect_garbage(["a", "b"], 0.0) == ["k"]
    assert "k" in a.collected()
    a.collect_garbage(["a", "b"], 11.0)
    assert a.collected() == {}


def test_newer_write_is_pushed_to_a_member_that_collected_the_key() -> None:
    a, b = ReplicatedSpace("subs", "a"), ReplicatedSpace("subs", "b")
    a.put("k", b"v")
    a.delete("k")
    exchange(a, b)
    exchange(b, a)
    assert b.collect_garbage(["a", "b"], 1.0) == ["k"]
    a.put("k", b"new")  # a has not collected yet and writes again
    exchange(b, a)  # only b's digest travels (b -> a): a must push its newer clock
    assert b.value("k") == b"new"
