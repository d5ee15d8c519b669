"""ACL: covers() is sound, parse errors name their line, and %u / %c substitution never widens a rule."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from appliance.broker.acl import READ, WRITE, Acl, AclSyntaxError, covers, overlaps
from appliance.protocol.topics import topic_matches

from .strategies import LEVELS, filters, instance_of


@st.composite
def generalisation(draw: st.DrawFn, topic_filter: str) -> str:
    """A filter made wider than `topic_filter` (levels turned into +, a tail turned into #) or a random one."""
    if draw(st.integers(0, 3)) == 0:
        return draw(filters())
    parts = topic_filter.split("/")
    out = [("+" if p != "#" and draw(st.booleans()) else p) for p in parts]
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(out) - 1))
        out = [*out[:cut], "#"]
    return "/".join(out)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_covers_is_sound(data: st.DataObject) -> None:
    topic_filter = data.draw(filters(), "filter")
    pattern = data.draw(generalisation(topic_filter), "pattern")
    assume(covers(pattern, topic_filter))
    for _ in range(8):
        topic = data.draw(instance_of(topic_filter), "topic")
        if topic_matches(topic_filter, topic):
            assert topic_matches(pattern, topic), f"{pattern!r} covers {topic_filter!r} but not its topic {topic!r}"


@settings(max_examples=100, deadline=None)
@given(filters())
def test_covers_is_reflexive(topic_filter: str) -> None:
    assert covers(topic_filter, topic_filter)


@settings(max_examples=150, deadline=None)
@given(filters(), filters(), st.data())
def test_overlaps_finds_every_shared_topic(first: str, second: str, data: st.DataObject) -> None:
    assert overlaps(first, second) == overlaps(second, first)
    for _ in range(8):
        topic = data.draw(instance_of(first), "topic")
        if topic_matches(first, topic) and topic_matches(second, topic):
            assert overlaps(first, second), f"{first!r} and {second!r} both match {topic!r}"


@settings(max_examples=150, deadline=None)
@given(filters(), filters(), st.data())
def test_granted_subscription_receives_no_denied_topic(grant: str, deny: str, data: st.DataObject) -> None:
    acl = Acl.parse(f"topic readwrite {grant}\ntopic deny {deny}\n")
    topic_filter = data.draw(st.one_of(filters(), generalisation(grant), generalisation(deny)), "filter")
    if not acl.allowed(READ, None, "c", topic_filter):
        return
    for _ in range(8):
        topic = data.draw(instance_of(topic_filter), "topic")
        if topic_matches(topic_filter, topic):
            assert topic_matches(grant, topic) and not topic_matches(deny, topic), topic


@pytest.mark.parametrize(("pattern", "topic_filter", "expected"), [
    ("a/#", "a", True),  # [MQTT-4.7.1-2] a/# matches its parent level
    ("a/+", "a/#", False),
    ("#", "$SYS/x", False),  # [MQTT-4.7.2-1]
    ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/x/y", True),
    ("a/+/c", "a/+/c", True),
    ("a/b", "a/+", False),
])
def test_covers_examples(pattern: str, topic_filter: str, expected: bool) -> None:
    assert covers(pattern, topic_filter) is expected


GOOD_LINES = ["", "# comment", "   ", "user alice", "client dev-1", "topic read a/#", "topic b/+", "topic deny a/x",
              "pattern write dev/%c/#", "pattern readwrite home/%u/+", "topic write $SYS/x"]
BAD_LINES = ["topic sometimes a/b", "frobnicate a", "user", "client", "topic", "pattern", "topic read a/#/b",
             "topic write a/b+", "pattern read #/x", "topic read"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(GOOD_LINES), max_size=8), st.sampled_from(BAD_LINES), st.data())
def test_parse_errors_name_the_line(before: list[str], bad: str, data: st.DataObject) -> None:
    after = data.draw(st.lists(st.sampled_from(GOOD_LINES + BAD_LINES), max_size=4))
    text = "\n".join([*before, bad, *after])
    with pytest.raises(AclSyntaxError) as caught:
        Acl.parse(text)
    assert str(caught.value).startswith(f"line {len(before) + 1}: "), str(caught.value)
    assert "\n" not in str(caught.value)


def test_good_lines_parse() -> None:
    acl = Acl.parse("\n".join(GOOD_LINES))
    assert acl.enabled
    assert [r.pattern for r in acl.users["alice"]] == []
    assert [r.pattern for r in acl.clients["dev-1"]] == ["a/#", "b/+", "a/x", "$SYS/x"]
    assert [r.pattern for r in acl.everyone] == ["dev/%c/#", "home/%u/+"]


ID_PARTS = ["a", "b", "%c", "%u", "%", "+", "#", "/", " "]
IDENTITY = st.lists(st.sampled_from(ID_PARTS), min_size=1, max_size=3).map("".join)
PATTERNS = ["dev/%c/#", "dev/%u/%c", "%u/+", "home/%u", "x-%c/in", "%c/%u/#"]


def literal_match(pattern: str, username: str | None, client_id: str, topic: str) -> bool:
    """The meaning of a pattern: %u and %c stand for the literal ids inside their level, never for wildcards."""
    p_levels, t_levels = pattern.split("/"), topic.split("/")
    for i, p in enumerate(p_levels):
        if p == "#":
            return not (i == 0 and topic.startswith("$"))
        if i >= len(t_levels):
            return False
        if p == "+":
            if i == 0 and topic.startswith("$"):
                return False
            continue
        if "%u" in p and username is None:
            return False
        expected = re.sub("%[uc]", lambda m: (username or "") if m.group() == "%u" else client_id, p)
        if expected != t_levels[i]:
            return False
    return len(p_levels) == len(t_levels)


@st.composite
def topic_near(draw: st.DrawFn, pattern: str, username: str | None, client_id: str) -> str:
    """A topic name an attacker would try: the pattern naively expanded in either order, or random levels."""
    if draw(st.booleans()):
        naive = pattern
        for key, value in draw(st.permutations([("%u", username or ""), ("%c", client_id)])):
            naive = naive.replace(key, value)
        levels = naive.split("/")
        levels = [draw(st.sampled_from(LEVELS)) if lv == "+" else lv for lv in levels if lv != "#"]
    else:
        parts = [*LEVELS, "dev", "home", "in", "x-" + client_id, client_id, username or "u", "%c", "%u"]
        levels = draw(st.lists(st.sampled_from(parts), min_size=1, max_size=4))
    topic = "/".join(levels).replace("+", "p").replace("#", "h")  # topic names carry no wildcards
    return topic or "a"


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PATTERNS), st.one_of(st.none(), IDENTITY), IDENTITY, st.data())
def test_substitution_never_widens(pattern: str, username: str | None, client_id: str, data: st.DataObject) -> None:
    acl = Acl.parse(f"pattern write {pattern}\n")
    topic = data.draw(topic_near(pattern, username, client_id), "topic")
    allowed = acl.allowed(WRITE, username, client_id, topic)
    reference = literal_match(pattern, username, client_id, topic)
    if allowed:
        assert reference, f"{pattern!r} with user={username!r} client={client_id!r} allowed {topic!r}"
    ids = (username or "") + client_id
    if not any(c in ids for c in "+#/"):
        assert allowed == reference
    assert not acl.allowed(READ, username, client_id, topic)  # a write rule grants no read


def test_username_cannot_smuggle_a_placeholder() -> None:
    acl = Acl.parse("pattern readwrite dev/%u/%c\n")
    assert acl.allowed(WRITE, "alice", "phone", "dev/alice/phone")
    assert not acl.allowed(WRITE, "%c", "alice", "dev/alice/alice")  # the user named "%c" is not user "alice"
    assert acl.allowed(WRITE, "%c", "alice", "dev/%c/alice")


def test_wildcard_ids_never_match_other_clients_topics() -> None:
    acl = Acl.parse("pattern readwrite dev/%c/#\n")
    assert acl.allowed(READ, None, "d1", "dev/d1/#")
    assert not acl.allowed(READ, None, "+", "dev/d1/x")
    assert not acl.allowed(READ, None, "#", "dev/d1/x")
    assert not acl.allowed(WRITE, None, "d1/x", "dev/d1/x/y")
    assert not acl.allowed(READ, None, "d1", "dev/+/#")  # a subscription wider than the client's own subtree


def test_deny_wins_and_acl_off_allows_everything() -> None:
    acl = Acl.parse("topic readwrite a/#\ntopic deny a/secret\nuser bob\ntopic read b/#\n")
    assert acl.allowed(WRITE, None, "c", "a/x")
    assert not acl.allowed(WRITE, None, "c", "a/secret")
    assert not acl.allowed(READ, None, "c", "a/#")  # covers a/secret, which is denied
    assert acl.allowed(READ, "bob", "c", "b/1") and not acl.allowed(READ, "eve", "c", "b/1")
    assert not acl.allowed(WRITE, "bob", "c", "b/1")
    assert Acl().allowed(WRITE, None, "c", "anything/at/all")
