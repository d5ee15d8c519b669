"""Hypothesis strategies for topic names and filters over a small alphabet, so that matches are frequent."""

from __future__ import annotations

from hypothesis import strategies as st

LEVELS = ["a", "b", "c", "", "$SYS", "$x", "é", "a b"]
level = st.sampled_from(LEVELS)


def _join(levels: list[str]) -> str:
    return "/".join(levels)


topics = st.lists(level, min_size=1, max_size=5).map(_join).filter(bool)  # a valid topic name is non-empty


@st.composite
def filters(draw: st.DrawFn) -> str:
    """A valid non-shared topic filter: + takes a whole level, # a whole last level [MQTT-4.7.1-2,3]."""
    levels = draw(st.lists(st.one_of(level, st.just("+")), min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return _join(levels) or "+"  # [""] joins to "", which is not a filter


@st.composite
def subscriptions(draw: st.DrawFn) -> tuple[str, str]:
    """(client id, filter), the filter shared (`$share/g/...`) one time in four."""
    client = draw(st.sampled_from(["c1", "c2", "c3", "c4"]))
    topic_filter = draw(filters())
    if draw(st.integers(0, 3)) == 0:
        topic_filter = f"$share/{draw(st.sampled_from(['g1', 'g2']))}/{topic_filter}"
    return client, topic_filter


@st.composite
def instance_of(draw: st.DrawFn, topic_filter: str) -> str:
    """A topic name built from `topic_filter` by filling its wildcards (it may still start with a $ level)."""
    out: list[str] = []
    for part in topic_filter.split("/"):
        if part == "+":
            out.append(draw(level))
        elif part == "#":
            out.extend(draw(st.lists(level, max_size=2)))
        else:
            out.append(part)
    return _join(out) or "a"
