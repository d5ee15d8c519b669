"""Subscription tree: topic filters with + and # [MQTT-4.7], shared subscriptions [MQTT-4.8.2], cached matching."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import SubscriptionOptions

SHARE_PREFIX = "$share/"


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """Return (share group, filter) for `$share/{group}/{filter}`, or (None, filter) for a plain filter."""
    if topic_filter.startswith(SHARE_PREFIX):
        group, _, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
        return group, inner
    return None, topic_filter


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    subscribers: dict[str, SubscriptionOptions] = field(default_factory=dict)
    shared: dict[str, dict[str, SubscriptionOptions]] = field(default_factory=dict)


@dataclass(slots=True)
class Match:
    """Everything one topic matched: plain subscribers and shared groups (each delivers to one member)."""

    subscribers: list[tuple[str, str, SubscriptionOptions]]  # (client id, filter, options)
    shared: list[tuple[str, str, dict[str, SubscriptionOptions]]]  # (group, filter, members)


class TopicTree:
    """Filter -> subscribers index answering "who matches this topic" with a bounded result cache."""

    def __init__(self, cache_size: int = 4096) -> None:
        self._root = _Node()
        self._cache: dict[str, Match] = {}
        self._cache_size = cache_size
        self.count = 0

    def add(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> bool:
        """Subscribe; returns True when the subscription is new (False when it replaced one)."""
        group, inner = split_shared(topic_filter)
        node = self._root
        for level in inner.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if group is None:
            existed = client_id in node.subscribers
            node.subscribers[client_id] = options
        else:
            members = node.shared.setdefault(group, {})
            existed = client_id in members
            members[client_id] = options
        self._cache.clear()
        if not existed:
            self.count += 1
        return not existed

    def remove(self, client_id: str, topic_filter: str) -> bool:
        """Unsubscribe; returns True when the subscription existed [MQTT-3.10.4-5]."""
        group, inner = split_shared(topic_filter)
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in inner.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if group is None:
            removed = node.subscribers.pop(client_id, None) is not None
        else:
            members = node.shared.get(group, {})
            removed = members.pop(client_id, None) is not None
            if not members:
                node.shared.pop(group, None)
        if removed:
            self.count -= 1
            self._cache.clear()
            for parent, level in reversed(path):  # prune empty branches
                child = parent.children[level]
                if child.children or child.subscribers or child.shared:
                    break
                del parent.children[level]
        return removed

    def match(self, topic: str) -> Match:
        """All subscriptions whose filter matches `topic`; `$` topics skip leading wildcards [MQTT-4.7.2-1]."""
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        result = Match([], [])
        levels = topic.split("/")
        self._walk(self._root, levels, 0, [], result, topic.startswith("$"))
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[topic] = result
        return result

    def _walk(self, node: _Node, levels: list[str], i: int, path: list[str], out: Match, dollar: bool) -> None:
        wildcards_ok = not (dollar and i == 0)
        if wildcards_ok:
            hash_node = node.children.get("#")
            if hash_node is not None:  # "a/#" also matches "a" [MQTT-4.7.1-2]
                self._collect(hash_node, "/".join([*path, "#"]), out)
        if i == len(levels):
            self._collect(node, "/".join(path), out)
            return
        level = levels[i]
        child = node.children.get(level)
        if child is not None:
            self._walk(child, levels, i + 1, [*path, level], out, dollar)
        if wildcards_ok:
            plus = node.children.get("+")
            if plus is not None:
                self._walk(plus, levels, i + 1, [*path, "+"], out, dollar)

    @staticmethod
    def _collect(node: _Node, topic_filter: str, out: Match) -> None:
        for client_id, options in node.subscribers.items():
            out.subscribers.append((client_id, topic_filter, options))
        for group, members in node.shared.items():
            out.shared.append((group, topic_filter, members))
