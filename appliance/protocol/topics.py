"""Topic names, topic filters, shared subscriptions and matching [MQTT-4.7, MQTT-4.8.2]."""

from __future__ import annotations

from typing import NamedTuple

from .errors import ProtocolError
from .reason_codes import ReasonCode

MAX_TOPIC_BYTES = 65_535
SHARE_PREFIX = "$share/"


class SharedFilter(NamedTuple):
    """A `$share/{group}/{filter}` subscription split into its parts [MQTT-4.8.2]."""

    group: str
    topic_filter: str


def _check_string(text: str, what: str, code: ReasonCode) -> None:
    if not text:
        raise ProtocolError(f"{what} is empty [MQTT-4.7.3-1]", code)
    if "\x00" in text:
        raise ProtocolError(f"{what} contains U+0000 [MQTT-4.7.3-2]", code)
    if len(text) * 4 > MAX_TOPIC_BYTES and len(text.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES:
        raise ProtocolError(f"{what} is longer than 65,535 bytes [MQTT-4.7.3-3]", code)


def validate_topic_name(topic: str) -> None:
    """Raise ProtocolError (TOPIC_NAME_INVALID) unless `topic` is a valid topic name [MQTT-4.7.3-1..3, MQTT-3.3.2-2]."""
    _check_string(topic, "topic name", ReasonCode.TOPIC_NAME_INVALID)
    if "+" in topic or "#" in topic:
        raise ProtocolError("topic name contains a wildcard [MQTT-3.3.2-2]", ReasonCode.TOPIC_NAME_INVALID)


def is_valid_topic_name(topic: str) -> bool:
    """Whether `topic` is a valid topic name."""
    try:
        validate_topic_name(topic)
    except ProtocolError:
        return False
    return True


def _check_wildcards(topic_filter: str) -> None:
    """The + and # placement rules [MQTT-4.7.1-1..3]."""
    if "#" in topic_filter:
        hash_at = topic_filter.index("#")
        if hash_at != len(topic_filter) - 1:
            raise ProtocolError("'#' must be the last character [MQTT-4.7.1-2]", ReasonCode.TOPIC_FILTER_INVALID)
        if hash_at and topic_filter[hash_at - 1] != "/":
            raise ProtocolError("'#' must occupy a whole level [MQTT-4.7.1-2]", ReasonCode.TOPIC_FILTER_INVALID)
    if "+" in topic_filter:
        for level in topic_filter.split("/"):
            if "+" in level and level != "+":
                raise ProtocolError("'+' must occupy a whole level [MQTT-4.7.1-3]", ReasonCode.TOPIC_FILTER_INVALID)


def parse_shared(topic_filter: str) -> SharedFilter | None:
    """Split `$share/{group}/{filter}` into (group, filter); None if not shared. Raises on a bad share name."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    rest = topic_filter[len(SHARE_PREFIX) :]
    group, sep, inner = rest.partition("/")
    if not group or "+" in group or "#" in group:
        raise ProtocolError("ShareName must be non-empty without wildcards [MQTT-4.8.2-1]",
                            ReasonCode.TOPIC_FILTER_INVALID)
    if not sep or not inner:
        raise ProtocolError("a shared subscription needs a topic filter after the ShareName [MQTT-4.8.2-2]",
                            ReasonCode.TOPIC_FILTER_INVALID)
    return SharedFilter(group, inner)


def validate_topic_filter(topic_filter: str) -> SharedFilter | None:
    """Raise ProtocolError (TOPIC_FILTER_INVALID) unless valid; returns the shared parts for `$share/...` filters."""
    _check_string(topic_filter, "topic filter", ReasonCode.TOPIC_FILTER_INVALID)
    shared = parse_shared(topic_filter)
    _check_wildcards(shared.topic_filter if shared else topic_filter)
    return shared


def is_valid_topic_filter(topic_filter: str) -> bool:
    """Whether `topic_filter` is a valid (possibly shared) topic filter."""
    try:
        validate_topic_filter(topic_filter)
    except ProtocolError:
        return False
    return True


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether `topic` matches the valid non-shared `topic_filter`; leading wildcards skip `$` topics [MQTT-4.7.2-1]."""
    if topic_filter == topic:
        return True
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False  # [MQTT-4.7.2-1]
    if "+" not in topic_filter and "#" not in topic_filter:
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    last = len(f_levels) - 1
    for i, level in enumerate(f_levels):
        if level == "#":
            return i == last  # '#' matches the parent level and any number of children [MQTT-4.7.1-2]
        if i >= len(t_levels):
            return False
        if level != "+" and level != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)
