"""Flat event batches [kind, wall, mono, fields, ...]: their marshal form, and their fields as Arrow columns by kind.

What DeliveryLog queues is a *queued* batch: every event carries CLOCK_MONOTONIC only; a positional event is its
kind, mono and values inline (kind, mono, *values; VALUES[kind] values, no tuple), a keyword event is kind, mono,
fields dict. The drain pairs the batch with the wall-minus-monotonic clock offset, and fixed_flat() turns it into
a flat batch. A batch's positional events (positional.LAYOUTS tuples) become columns by transposing each
kind's tuples at once (no dict per event); keyword events (dicts) take the per-event path. Columns come back in emit
order.
"""

from __future__ import annotations

import marshal
from bisect import bisect_left, bisect_right
from enum import Enum
from operator import itemgetter
from typing import Any

from .positional import LAYOUTS, USER, fields_of, publisher_seq
from .positional import plain as plain_positional
from .schema import EMIT_FIELDS, FIELDS, field_problem

ITEM_LEN = 4  # entries per event in a flat batch [kind, wall, mono, fields, kind, ...]
# Kinds whose records carry all of a message's fields when the broker passes message=; others carry only msg_id.
FULL_MESSAGE_KINDS = frozenset({"received", "forwarded", "replicated", "migrated", "dropped", "expired"})
NULLABLE = tuple(name for name, (_, nullable) in FIELDS.items() if nullable)
_ARROW_TYPES = {"string": "string", "int": "int32", "long": "int64", "boolean": "bool_"}

Item = tuple[str, int, int, Any]  # kind, wall clock ns, CLOCK_MONOTONIC ns, fields (a dict or a LAYOUTS tuple)


VALUES = {kind: len(layout) for kind, layout in LAYOUTS.items()}  # values a queued positional event carries inline
QUEUED_MIN = 3  # entries of the shortest queued event (kind, mono, msg_id or fields)


def fixed_flat(queued: list[Any], offset: int) -> list[Any]:
    """A queued batch as a flat batch [kind, wall, mono, fields, ...] (wall = mono + `offset`); ValueError if bad."""
    out: list[Any] = []
    sizes = VALUES
    i, n = 0, len(queued)
    try:
        while i < n:
            kind = queued[i]
            mono = queued[i + 1]
            first = queued[i + 2]
            if type(first) is dict:
                out += (kind, mono + offset, mono, first)
                i += 3
            else:
                end = i + 2 + sizes[kind]
                out += (kind, mono + offset, mono, tuple(queued[i + 2 : end]))
                i = end
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"queued batch does not parse at entry {i}") from None
    if i != n:
        raise ValueError(f"queued batch ends inside an event ({n} entries, next event at {i})")
    return out


def queued_starts(queued: list[Any], limit: int | None = None) -> list[int]:
    """Offsets of the events of a queued batch (of its first `limit` events); ValueError when it does not parse."""
    starts: list[int] = []
    sizes = VALUES
    i, n = 0, len(queued)
    try:
        while i < n and (limit is None or len(starts) < limit):
            starts.append(i)
            i += 3 if type(queued[i + 2]) is dict else 2 + sizes[queued[i]]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"queued batch does not parse at entry {i}") from None
    if i > n:
        raise ValueError(f"queued batch ends inside an event ({n} entries, next event at {i})")
    return starts


def plain_queued(queued: list[Any]) -> list[Any]:
    """A queued batch with builtin values only (what pack() does for a flat batch), for marshal."""
    out: list[Any] = []
    starts = queued_starts(queued)
    for start, end in zip(starts, [*starts[1:], len(queued)], strict=True):
        kind, mono = str(queued[start]), queued[start + 1]
        if end - start == 3 and type(queued[start + 2]) is dict:
            out += (kind, mono, _plain_fields(kind, queued[start + 2]))
        else:
            out += (kind, mono, *plain_positional(kind, tuple(queued[start + 2 : end])))
    return out


def items_of(flat: list[Any]) -> list[Item]:
    """The events of a flat batch [kind, wall, mono, fields, ...] as Items."""
    it = iter(flat)
    return list(zip(it, it, it, it, strict=False))


def message_tuple(msg: Any, full: bool) -> tuple[Any, ...]:
    """A broker Message as plain values (msg_id, publisher, topic, qos, retain, payload size, user properties)."""
    if not full:
        return (msg.msg_id, None, None, None, None, None, ())
    props = getattr(msg, "properties", None)
    user = getattr(props, "user_properties", None) or ()
    return (msg.msg_id, msg.publisher, msg.topic, msg.qos, msg.retain, len(msg.payload), tuple(user))


# -- marshal form (the pipe to the writer child, and the binary journal) ----------------------------------------------

def _plain_value(value: Any) -> Any:
    """A value marshal can carry: exact builtins pass, enums become their lower-case name, the rest plain or text."""
    if type(value) in (str, int, float, bool, type(None), tuple):
        return value
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name.lower()
    for plain in (bool, int, float, str):
        if isinstance(value, plain):
            return plain(value)
    return str(value)


def _plain_message(msg: Any, kind: str) -> tuple[Any, ...]:
    """A message= value (a Message or its tuple) as a tuple of builtin values."""
    if type(msg) is not tuple:
        msg = message_tuple(msg, full=kind in FULL_MESSAGE_KINDS)
    head = tuple(_plain_value(v) for v in msg[:6])
    return (*head, tuple((str(k), str(v)) for k, v in msg[6]))


def _plain_fields(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A keyword event's fields with builtin values only (a message= value as a tuple of them)."""
    fields = dict(fields)
    msg = fields.pop("message", None)
    plain = {str(n): _plain_value(v) for n, v in fields.items()}
    if msg is not None:
        plain["message"] = _plain_message(msg, kind)
    return plain


def pack(flat: list[Any]) -> bytes:
    """Marshal a flat batch in one call (non-builtin values take the slow path and become builtins)."""
    try:
        return marshal.dumps(flat, 4)
    except ValueError:  # an enum, a Message or another non-builtin value somewhere
        clean: list[Any] = []
        for kind, wall, mono, fields in items_of(flat):
            if type(fields) is tuple:
                clean += (str(kind), wall, mono, plain_positional(str(kind), fields))
            else:
                clean += (str(kind), wall, mono, _plain_fields(kind, fields))
        return marshal.dumps(clean, 4)


# -- one keyword event's fields -------------------------------------------------------------------------------------

def reason_text(value: Any) -> str:
    """A reason as schema text: enum members by lower-case name, anything else by str()."""
    if isinstance(value, Enum):
        return value.name.lower()
    return str(value)


def expand_message(kind: str, fields: dict[str, Any], seq_property: str) -> None:
    """Replace a `message=` field (a broker Message or its message_tuple) by schema fields; explicit ones win."""
    msg = fields.pop("message")
    if msg is None:
        return
    msg_id, publisher, topic, qos, retain, size, user_properties = (
        msg if type(msg) is tuple else message_tuple(msg, full=True)
    )
    fields.setdefault("msg_id", msg_id)
    if kind not in FULL_MESSAGE_KINDS:
        return  # the rest joins in from the message's `received` record by msg_id
    fields.setdefault("publisher", publisher or None)
    fields.setdefault("topic", topic)
    fields.setdefault("qos", qos)
    fields.setdefault("retain", retain)
    fields.setdefault("payload_size", size)
    if "publisher_seq" not in fields:
        seq = publisher_seq(user_properties, seq_property)
        if seq is not None:
            fields["publisher_seq"] = seq


def event_fields(kind: str, fields: Any, seq_property: str) -> tuple[dict[str, Any], int]:
    """One event's schema fields (absent values left out) and how many fields outside the schema were dropped."""
    if type(fields) is tuple:  # a positional hot event: schema fields only, never None, no reason
        try:
            return fields_of(kind, fields, seq_property), 0
        except (KeyError, ValueError, IndexError, TypeError):  # not a layout this writer knows
            return {}, len(fields)
    if not fields:
        return {}, 0
    bad = 0
    if "message" in fields:
        fields = dict(fields)
        expand_message(kind, fields, seq_property)
    if None in fields.values() or not fields.keys() <= EMIT_FIELDS:
        kept = {key: v for key, v in fields.items() if v is not None and key in EMIT_FIELDS}
        bad = sum(1 for key in fields if key not in EMIT_FIELDS)
        fields = kept
    reason = fields.get("reason")
    if reason is not None and type(reason) is not str:
        fields = {**fields, "reason": reason_text(reason)}
    return fields, bad


# -- a batch's fields as Arrow columns --------------------------------------------------------------------------------

def arrow_type(pa: Any, name: str) -> Any:
    """The Arrow type of schema field `name`."""
    return getattr(pa, _ARROW_TYPES[FIELDS[name][0]])()


def _array(pa: Any, name: str, values: Any) -> tuple[Any, int]:
    """An Arrow array for one nullable column; values the schema type cannot hold become null (and are counted)."""
    dtype = arrow_type(pa, name)
    if isinstance(values, pa.Array):
        return values.cast(dtype), 0
    if type(values) is not list:
        values = list(values)  # pyarrow converts a list many times faster than a tuple
    return column_array(pa, name, values, dtype)


def column_array(pa: Any, name: str, values: list[Any], dtype: Any) -> tuple[Any, int]:
    """An Arrow array of `dtype` for column `name`; values the type cannot hold become null (and are counted)."""
    try:
        return pa.array(values, dtype), 0
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        bad = 0
        clean = []
        for value in values:
            if value is not None and field_problem(name, value) is not None:
                bad += 1
                value = None
            clean.append(value)
        return pa.array(clean, dtype), bad


def _positional_columns(kind: str, rows: tuple[Any, ...], seq_property: str) -> dict[str, Any]:
    """Column name -> values of one kind's positional tuples, transposed at once."""
    cols = list(zip(*rows, strict=True))
    out: dict[str, Any] = {}
    for name, values in zip(LAYOUTS[kind], cols, strict=True):
        if name:
            out[name] = values
    if kind == "received":
        out["publisher"] = [p or None for p in out["publisher"]]
        users = cols[USER]
        if any(users):
            out["publisher_seq"] = _publisher_seqs(users, seq_property)
    return out


def _publisher_seqs(users: tuple[Any, ...], name: str) -> Any:
    """publisher_seq of each `received` event's user properties (positional.publisher_seq, for a column at once)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:  # the first property called `name` (reversed: the first one wins in the dict), parsed by Arrow
        texts = pa.array([dict(reversed(u)).get(name) if u else None for u in users], pa.string())
        if pc.all(pc.match_substring_regex(texts, "^-?[0-9]{1,19}$")).as_py() is not False:  # plain decimal only
            return pc.cast(texts, pa.int64())  # out of range raises: one by one below
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        pass
    return [publisher_seq(u, name) if u else None for u in users]  # an odd value somewhere: one by one, exactly


def _dict_columns(kinds: Any, rows: Any, seq_property: str) -> tuple[dict[str, Any], int]:
    """Column name -> values of keyword (or odd positional) events, one event at a time; and fields dropped."""
    dicts = []
    bad = 0
    for kind, fields in zip(kinds, rows, strict=True):
        f, b = event_fields(kind, fields, seq_property)
        dicts.append(f)
        bad += b
    names = {name for f in dicts for name in f}
    return {name: [f.get(name) for f in dicts] for name in NULLABLE if name in names}, bad


def nullable_columns(pa: Any, kinds: list[str], rows: list[Any], seq_property: str) -> tuple[list[Any], int]:
    """The schema's nullable columns (Arrow arrays in NULLABLE order) for events `kinds`/`rows`, in their order.

    Events are sorted by kind (a stable sort), each kind's positional tuples transposed into columns, the pieces
    joined and put back in emit order with one `take`. Returns the arrays and the count of values dropped.
    """
    n = len(kinds)
    if n > 1:
        order = sorted(range(n), key=kinds.__getitem__)
        pick = itemgetter(*order)
        by_kind, sorted_rows = pick(kinds), pick(rows)
    else:
        order, by_kind, sorted_rows = [0] * n, tuple(kinds), tuple(rows)
    pieces: list[tuple[int, dict[str, Any]]] = []  # (rows, columns) per kind, in sorted order
    bad = 0
    for kind in sorted(set(kinds)):
        lo, hi = bisect_left(by_kind, kind), bisect_right(by_kind, kind)
        group = sorted_rows[lo:hi]
        layout = LAYOUTS.get(kind)
        if layout is not None and set(map(type, group)) == {tuple} and set(map(len, group)) == {len(layout)}:
            pieces.append((hi - lo, _positional_columns(kind, group, seq_property)))
        else:
            cols, dropped = _dict_columns(by_kind[lo:hi], group, seq_property)
            bad += dropped
            pieces.append((hi - lo, cols))
    columns: dict[str, Any] = {}
    for name in NULLABLE:
        if not any(name in cols for _, cols in pieces):
            continue
        dtype = arrow_type(pa, name)
        chunks = []
        for count, cols in pieces:
            values = cols.get(name)
            if values is None:
                chunks.append(pa.nulls(count, dtype))
            else:
                array, dropped = _array(pa, name, values)
                bad += dropped
                chunks.append(array)
        columns[name] = pa.concat_arrays(chunks) if len(chunks) > 1 else chunks[0]
    if len(pieces) > 1 and columns:
        back = pa.compute.sort_indices(pa.array(order, pa.int64()))
        columns = dict(zip(columns, pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
                           .take(back).columns, strict=True))
    return [columns[name] if name in columns else pa.nulls(n, arrow_type(pa, name)) for name in NULLABLE], bad
