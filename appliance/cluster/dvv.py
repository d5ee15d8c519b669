"""Dotted version vector sets (one DVVSet per replicated key), with tombstones, GC and a compact binary encoding.

Model (after Almeida et al., "Scalable and Accurate Causality Tracking for Eventually Consistent Stores"): a clock
holds, per node id, a counter `n` (every event of that node up to `n` has been seen for this key) and the values still
alive that were written by that node, each tagged with its dot (node, counter). A value is discarded once a write whose
context covers its dot is known; concurrent writes survive side by side as siblings.

Differences from the paper's reference shape, chosen for a store that only writes through a coordinating node:
- no anonymous (client-side, dot-less) values: every write is an `update` at a node, so every value has a dot;
- a write may take a counter above `n + 1` (`floor`): pass a node-wide, persisted, monotonically increasing event
  counter so that a node's dots stay unique even after a key was garbage-collected and written again. The skipped
  counters are "seen" for this key, which is true: they are events of other keys, or of this key's collected past.
- deletes are writes of the tombstone value `None`; a key whose live values are all gone and whose clock every member
  has seen may be dropped (`collectable`).

Sibling resolution (`resolve`), the one rule every node applies so that all pick the same value whatever the order in
which they merged: a live value beats a concurrent delete (add-wins: for subscriptions, keeping one is the side that
loses no message); among live siblings the greatest `(order_key(value), value)` wins, bytes compared lexicographically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ClusterError

Value = bytes | None  # None is the tombstone
VersionVector = dict[str, int]
Dotted = tuple[tuple[int, Value], ...]  # (counter, value), counters strictly descending


class DVVError(ClusterError, ValueError):
    """A clock or encoding that breaks the DVVSet invariants (bad bytes, duplicate nodes, unordered dots)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One node's part of a clock: everything up to `counter` seen, `dotted` the values of its still-live writes."""

    node: str
    counter: int
    dotted: Dotted = ()


@dataclass(frozen=True, slots=True)
class DVVSet:
    """The causal state of one key: entries sorted by node id; immutable, every operation returns a new clock."""

    entries: tuple[Entry, ...] = ()

    def __post_init__(self) -> None:
        """Reject clocks that break the invariants (so decode and hand-built clocks are checked the same way)."""
        previous: str | None = None
        for e in self.entries:
            if previous is not None and e.node <= previous:
                raise DVVError(f"entries not strictly sorted by node id at {e.node!r}")
            previous = e.node
            if e.counter < 0:
                raise DVVError(f"negative counter for {e.node!r}")
            last = e.counter + 1
            for dot, _ in e.dotted:
                if not 0 < dot < last:
                    raise DVVError(f"dot {dot} of {e.node!r} out of order or above counter {e.counter}")
                last = dot

    def __iter__(self) -> Iterator[Entry]:
        """Iterate over the entries, sorted by node id."""
        return iter(self.entries)


EMPTY = DVVSet()


def _by_node(clock: DVVSet) -> dict[str, Entry]:
    """Index a clock's entries by node id."""
    return {e.node: e for e in clock.entries}


def _build(entries: Iterable[Entry]) -> DVVSet:
    """Make a clock from entries in any order."""
    return DVVSet(tuple(sorted(entries, key=lambda e: e.node)))


def join(clock: DVVSet) -> VersionVector:
    """The version vector of everything the clock has seen (node -> counter); the context a reader sends back."""
    return {e.node: e.counter for e in clock.entries if e.counter}


def values(clock: DVVSet, *, tombstones: bool = False) -> list[Value]:
    """All sibling values (live ones only unless `tombstones`), in a deterministic order: by node, newest first."""
    return [v for e in clock.entries for _, v in e.dotted if tombstones or v is not None]


def dots(clock: DVVSet) -> list[tuple[str, int, Value]]:
    """Every (node, counter, value) still in the clock."""
    return [(e.node, d, v) for e in clock.entries for d, v in e.dotted]


def _merge_entry(a: Entry, b: Entry) -> Entry:
    """Join one node's entries: keep a dot if the other side holds it too or has not seen it yet."""
    kept: dict[int, Value] = {}
    b_dots = dict(b.dotted)
    a_dots = dict(a.dotted)
    for dot, val in a.dotted:
        if dot > b.counter or dot in b_dots:
            kept[dot] = val
    for dot, val in b.dotted:
        if dot > a.counter or dot in a_dots:
            if dot in kept and kept[dot] != val:
                # Same dot, different value: only a corrupted replica does this; pick one deterministically.
                kept[dot] = max(kept[dot], val, key=_value_key)
            else:
                kept[dot] = val
    dotted = tuple(sorted(kept.items(), key=lambda dv: -dv[0]))
    return Entry(a.node, max(a.counter, b.counter), dotted)


def sync(a: DVVSet, b: DVVSet) -> DVVSet:
    """Merge two replicas of one key: commutative, associative and idempotent."""
    if a is b or a == b:
        return a
    ia, ib = _by_node(a), _by_node(b)
    merged: list[Entry] = []
    for node in ia.keys() | ib.keys():
        ea, eb = ia.get(node), ib.get(node)
        if ea is None:
            assert eb is not None
            merged.append(eb)
        elif eb is None:
            merged.append(ea)
        else:
            merged.append(_merge_entry(ea, eb))
    return _build(merged)


def discard(clock: DVVSet, context: Mapping[str, int]) -> DVVSet:
    """Drop the values whose dots the context covers; the context's counters become seen."""
    ic = _by_node(clock)
    out: list[Entry] = []
    for node in ic.keys() | context.keys():
        seen = context.get(node, 0)
        e = ic.get(node)
        if e is None:
            out.append(Entry(node, seen))
        else:
            out.append(Entry(node, max(e.counter, seen), tuple(dv for dv in e.dotted if dv[0] > seen)))
    return _build(x for x in out if x.counter or x.dotted)


def update(clock: DVVSet, context: Mapping[str, int], value: Value, node: str, floor: int = 0) -> DVVSet:
    """Write `value` at `node` having read `context`: what the context covers is replaced, the rest stays as siblings.

    The new dot's counter is max(node's counter in clock or context, floor) + 1 (see the module note on `floor`).
    Pass `context=join(clock)` for a write that supersedes everything this node knows.
    """
    base = discard(clock, context)
    entries = _by_node(base)
    own = entries.get(node, Entry(node, 0))
    counter = max(own.counter, floor) + 1
    entries[node] = Entry(node, counter, ((counter, value), *own.dotted))
    return _build(entries.values())


def delete(clock: DVVSet, context: Mapping[str, int], node: str, floor: int = 0) -> DVVSet:
    """Write a tombstone at `node`: an update with the value None."""
    return update(clock, context, None, node, floor)


def dot_of_last_write(clock: DVVSet, node: str) -> int:
    """The counter `node` last used in this clock (0 if none): feed it back into the node-wide event counter."""
    for e in clock.entries:
        if e.node == node:
            return e.counter
    return 0


def descends(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    """True when version vector `a` has seen everything `b` has (a >= b pointwise)."""
    return all(a.get(node, 0) >= n for node, n in b.items())


def less(a: DVVSet, b: DVVSet) -> bool:
    """True when clock `a` is strictly older than `b` (b has seen all a has seen, and more)."""
    ja, jb = join(a), join(b)
    return descends(jb, ja) and ja != jb


def concurrent(a: DVVSet, b: DVVSet) -> bool:
    """True when neither clock has seen all of the other."""
    ja, jb = join(a), join(b)
    return not descends(ja, jb) and not descends(jb, ja)


def _value_key(v: Value) -> tuple[int, bytes]:
    """Total order on values: tombstone lowest, then bytes lexicographically."""
    return (0, b"") if v is None else (1, v)


def resolve(clock: DVVSet, order_key: Callable[[bytes], Any] | None = None) -> bytes | None:
    """The value to act on: add-wins over tombstones, then the greatest (order_key(v), v); None if deleted."""
    live = [v for v in values(clock) if v is not None]
    if not live:
        return None
    if order_key is None:
        return max(live)
    key = order_key
    return max(live, key=lambda v: (key(v), v))


def is_deleted(clock: DVVSet) -> bool:
    """True when no live value remains (absent key or tombstones only)."""
    return not values(clock)


def seen_by_all(clock: DVVSet, member_vectors: Iterable[Mapping[str, int]]) -> bool:
    """True when every member's vector for this key (from its digest) has seen everything this clock has seen."""
    target = join(clock)
    return all(descends(vv, target) for vv in member_vectors)


def collectable(clock: DVVSet, member_vectors: Iterable[Mapping[str, int]]) -> bool:
    """True when the key holds only tombstones and every member has seen them: it may be dropped from storage.

    `member_vectors` must include one vector per current member (this node included); a member missing from the
    list would let a stale replica resurrect the key, so pass the full membership or do not collect.
    """
    return is_deleted(clock) and seen_by_all(clock, member_vectors)


# ---- compact binary encoding -------------------------------------------------------------------------------------
# clock   := 0x01 varint(n_entries) entry*
# entry   := str(node) varint(counter) varint(n_dots) dot*      (entries sorted by node, dots descending)
# dot     := varint(counter) varint(0 | len(value)+1) value     (0 = tombstone)
# vv      := varint(n) (str(node) varint(counter))*             (sorted by node)
# str     := varint(len) utf8

_FORMAT = 1


def _put_varint(out: bytearray, n: int) -> None:
    """Append an unsigned LEB128 varint."""
    if n < 0:
        raise DVVError("negative integer in encoding")
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _get_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read an unsigned LEB128 varint at `pos`; return (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise DVVError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DVVError("varint too long")


def _put_str(out: bytearray, s: str) -> None:
    """Append a length-prefixed UTF-8 string."""
    raw = s.encode()
    _put_varint(out, len(raw))
    out += raw


def _get_bytes(data: bytes | memoryview, pos: int, n: int) -> tuple[bytes, int]:
    """Read exactly n bytes at `pos`."""
    if pos + n > len(data):
        raise DVVError("truncated field")
    return bytes(data[pos : pos + n]), pos + n


def _get_str(data: bytes | memoryview, pos: int) -> tuple[str, int]:
    """Read a length-prefixed UTF-8 string."""
    n, pos = _get_varint(data, pos)
    raw, pos = _get_bytes(data, pos, n)
    try:
        return raw.decode(), pos
    except UnicodeDecodeError as exc:
        raise DVVError("node id is not UTF-8") from exc


def encode(clock: DVVSet) -> bytes:
    """Serialise a clock (deterministic: equal clocks give equal bytes)."""
    out = bytearray([_FORMAT])
    _put_varint(out, len(clock.entries))
    for e in clock.entries:
        _put_str(out, e.node)
        _put_varint(out, e.counter)
        _put_varint(out, len(e.dotted))
        for dot, val in e.dotted:
            _put_varint(out, dot)
            if val is None:
                _put_varint(out, 0)
            else:
                _put_varint(out, len(val) + 1)
                out += val
    return bytes(out)


def decode_from(data: bytes | memoryview, pos: int = 0) -> tuple[DVVSet, int]:
    """Parse a clock at `pos`; return (clock, next position). Raises DVVError on bad input."""
    if pos >= len(data) or data[pos] != _FORMAT:
        raise DVVError("unknown DVVSet encoding")
    pos += 1
    count, pos = _get_varint(data, pos)
    entries: list[Entry] = []
    for _ in range(count):
        node, pos = _get_str(data, pos)
        counter, pos = _get_varint(data, pos)
        ndots, pos = _get_varint(data, pos)
        dotted: list[tuple[int, Value]] = []
        for _ in range(ndots):
            dot, pos = _get_varint(data, pos)
            size, pos = _get_varint(data, pos)
            val: Value = None
            if size:
                val, pos = _get_bytes(data, pos, size - 1)
            dotted.append((dot, val))
        entries.append(Entry(node, counter, tuple(dotted)))
    return DVVSet(tuple(entries)), pos


def decode(data: bytes | memoryview) -> DVVSet:
    """Parse a whole buffer as one clock."""
    clock, pos = decode_from(data)
    if pos != len(data):
        raise DVVError("trailing bytes after DVVSet")
    return clock


def encode_vv(vv: Mapping[str, int]) -> bytes:
    """Serialise a version vector (sorted, zero counters dropped)."""
    out = bytearray()
    items = sorted((k, n) for k, n in vv.items() if n)
    _put_varint(out, len(items))
    for node, n in items:
        _put_str(out, node)
        _put_varint(out, n)
    return bytes(out)


def decode_vv_from(data: bytes | memoryview, pos: int = 0) -> tuple[VersionVector, int]:
    """Parse a version vector at `pos`; return (vector, next position)."""
    count, pos = _get_varint(data, pos)
    vv: VersionVector = {}
    for _ in range(count):
        node, pos = _get_str(data, pos)
        n, pos = _get_varint(data, pos)
        vv[node] = n
    return vv, pos


def decode_vv(data: bytes | memoryview) -> VersionVector:
    """Parse a whole buffer as one version vector."""
    vv, pos = decode_vv_from(data)
    if pos != len(data):
        raise DVVError("trailing bytes after version vector")
    return vv
