"""Membership bookkeeping and rendezvous placement: agreement, spread, minimal movement."""

from __future__ import annotations

from collections import Counter

from appliance.cluster.membership import Membership, rendezvous

NODES = ["n1", "n2", "n3", "n4", "n5"]
KEYS = [f"client-{i}" for i in range(2000)]


def test_placement_is_the_same_whatever_order_nodes_are_listed() -> None:
    for key in KEYS[:200]:
        assert rendezvous(key, NODES, 2) == rendezvous(key, list(reversed(NODES)), 2) == rendezvous(key, set(NODES), 2)
        owner, replica = rendezvous(key, NODES, 2)
        assert owner != replica


def test_owners_spread_over_all_nodes() -> None:
    owners = Counter(rendezvous(k, NODES, 1)[0] for k in KEYS)
    assert set(owners) == set(NODES)
    assert min(owners.values()) > len(KEYS) / len(NODES) / 2  # no node gets less than half its fair share


def test_a_leaving_node_moves_only_its_own_keys() -> None:
    before = {k: rendezvous(k, NODES, 2) for k in KEYS}
    after = {k: rendezvous(k, [n for n in NODES if n != "n3"], 2) for k in KEYS}
    for k in KEYS:
        if "n3" not in before[k]:
            assert after[k] == before[k]
        else:
            kept = [n for n in before[k] if n != "n3"]
            assert after[k][: len(kept)] == kept  # the survivor keeps its rank; a new replica is appended


def test_membership_tracks_links_and_versions() -> None:
    m = Membership("n1")
    assert m.live() == ["n1"]
    m.known("n2", ("10.0.0.2", 7946))
    v = m.version
    assert m.set_up("n2", True) and m.version == v + 1
    assert not m.set_up("n2", True)
    assert m.live() == ["n1", "n2"]
    m.set_up("n2", False)
    assert m.unreachable() == ["n2"] and m.live() == ["n1"]
    assert m.placement("c", 2) == ["n1"]
    assert sorted(m.placement("c", 2, live_only=False)) == ["n1", "n2"]
    m.forget("n2")
    assert m.all() == ["n1"]
    assert not m.set_up("n1", False)  # ourselves: always up
