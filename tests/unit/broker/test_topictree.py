"""TopicTree.match agrees with the reference matcher appliance.protocol.topics.topic_matches [MQTT-4.7, MQTT-4.8.2]."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.broker.model import SubscriptionOptions
from appliance.broker.topictree import TopicTree, split_shared
from appliance.protocol.topics import topic_matches

from .strategies import subscriptions, topics

SubList = list[tuple[str, str]]


def expected(subs: SubList, topic: str) -> tuple[set[tuple[str, str]], dict[tuple[str, str], set[str]]]:
    """Plain (client, filter) pairs and shared (group, filter) -> members that match `topic`, by the reference."""
    plain: set[tuple[str, str]] = set()
    shared: dict[tuple[str, str], set[str]] = defaultdict(set)
    for client, topic_filter in subs:
        group, inner = split_shared(topic_filter)
        if topic_matches(inner, topic):
            if group is None:
                plain.add((client, inner))
            else:
                shared[(group, inner)].add(client)
    return plain, dict(shared)


def observed(tree: TopicTree, topic: str) -> tuple[set[tuple[str, str]], dict[tuple[str, str], set[str]]]:
    """What the tree matched, in the same shape; fails on a subscriber reported twice."""
    match = tree.match(topic)
    plain = [(client, topic_filter) for client, topic_filter, _ in match.subscribers]
    assert len(plain) == len(set(plain)), f"duplicate matches {plain}"
    groups = [(group, topic_filter) for group, topic_filter, _ in match.shared]
    assert len(groups) == len(set(groups)), f"duplicate groups {groups}"
    return set(plain), {(g, f): set(members) for g, f, members in match.shared}


@settings(max_examples=150, deadline=None)
@given(st.lists(subscriptions(), max_size=12), st.lists(topics, min_size=1, max_size=6))
def test_match_agrees_with_topic_matches(subs: SubList, probe: list[str]) -> None:
    tree = TopicTree()
    for client, topic_filter in subs:
        tree.add(client, topic_filter, SubscriptionOptions(qos=1))
    assert tree.count == len(set(subs))
    for topic in probe + probe:  # the second pass is answered from the cache
        assert observed(tree, topic) == expected(subs, topic), topic


@settings(max_examples=100, deadline=None)
@given(st.lists(subscriptions(), max_size=12), st.data())
def test_match_after_removals_agrees_and_cache_is_not_stale(subs: SubList, data: st.DataObject) -> None:
    tree = TopicTree(cache_size=4)
    probe = data.draw(st.lists(topics, min_size=1, max_size=6))
    for client, topic_filter in subs:
        tree.add(client, topic_filter, SubscriptionOptions())
    for topic in probe:
        tree.match(topic)  # fill the cache before the removals
    unique = sorted(set(subs))
    gone = data.draw(st.lists(st.sampled_from(unique), unique=True) if unique else st.just([]))
    for client, topic_filter in gone:
        assert tree.remove(client, topic_filter)
        assert not tree.remove(client, topic_filter)  # [MQTT-3.10.4-5]: a second removal finds nothing
    left = [s for s in unique if s not in gone]
    assert tree.count == len(left)
    for topic in probe:
        assert observed(tree, topic) == expected(left, topic), topic
    for client, topic_filter in left:
        tree.remove(client, topic_filter)
    assert tree.count == 0
    assert not tree._root.children, "empty branches are pruned"


def test_dollar_topics_skip_leading_wildcards_but_match_explicit_filters() -> None:  # [MQTT-4.7.2-1]
    tree = TopicTree()
    for topic_filter in ("#", "+/broker/#", "$SYS/#", "$SYS/+/uptime", "$share/g/#", "$share/g/$SYS/#"):
        tree.add("c", topic_filter, SubscriptionOptions())
    plain, shared = observed(tree, "$SYS/broker/uptime")
    assert plain == {("c", "$SYS/#"), ("c", "$SYS/+/uptime")}
    assert set(shared) == {("g", "$SYS/#")}


def test_replacing_options_is_not_a_new_subscription() -> None:
    tree = TopicTree()
    assert tree.add("c", "a/+", SubscriptionOptions(qos=0))
    assert not tree.add("c", "a/+", SubscriptionOptions(qos=2))
    assert tree.count == 1
    assert [opts.qos for _, _, opts in tree.match("a/b").subscribers] == [2]
