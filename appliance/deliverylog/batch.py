"""Event batches as the writer receives them (lanes), as the journal and JSON Lines take them (flat), as Arrow columns.

What DeliveryLog drains is a *lanes* batch: one list per hot kind (LANE_KINDS), each event its CLOCK_MONOTONIC and
its values inline (mono, *values; VALUES[kind] values, no tuple), and lane 0 for keyword events (kind, mono, fields
dict). A hot lane becomes columns by slicing (lane[j::width], no Python loop per event); the lanes are merged into
emit order by a stable sort on mono (ties: lane order). The drain pairs the lanes with the wall-minus-monotonic clock
offset. A *flat* batch [kind, wall, mono, fields, ...] (lanes_flat) is the per-event form; older journals also hold
*queued* batches (one interleaved list, fixed_flat).
"""

from __future__ import annotations

import marshal
from bisect import bisect_left, bisect_right
from enum import Enum
from itertools import chain
from operator import itemgetter
from typing import Any

from .positional import LAYOUTS, USER, fields_of, publisher_seq
from .positional import plain as plain_positional
from .schema import EMIT_FIELDS, FIELDS, KIND_SET, KINDS, field_problem

NativeRecorder: Any
_decode_recorded: Any
try:  # the optional C recorder (setup.py builds it; _recorder.c): its take() bytes carry lanes 1..5
    from ._recorder import Recorder as NativeRecorder
    from ._recorder import decode as _decode_recorded
except ImportError:  # pragma: no cover - a build without a C compiler
    NativeRecorder = _decode_recorded = None

ITEM_LEN = 4  # entries per event in a flat batch [kind, wall, mono, fields, kind, ...]
# Kinds whose records carry all of a message's fields when the broker passes message=; others carry only msg_id.
FULL_MESSAGE_KINDS = frozenset({"received", "forwarded", "replicated", "migrated", "dropped", "expired"})
NULLABLE = tuple(name for name, (_, nullable) in FIELDS.items() if nullable)
_ARROW_TYPES = {"string": "string", "int": "int32", "long": "int64", "boolean": "bool_"}

Item = tuple[str, int, int, Any]  # kind, wall clock ns, CLOCK_MONOTONIC ns, fields (a dict or a LAYOUTS tuple)


VALUES = {kind: len(layout) for kind, layout in LAYOUTS.items()}  # values a queued positional event carries inline
KIND_INDEX = {kind: i for i, kind in enumerate(KINDS)}  # a kind's index in the kind column's dictionary
LANE_KINDS = ("received", "committed", "routed", "delivered", "acked")  # lanes 1..5; lane 0: keyword events
LANE_WIDTHS = (3, *(1 + VALUES[kind] for kind in LANE_KINDS))  # entries per event in each lane
Lanes = list[list[Any]]


def lane_counts(lanes: Lanes) -> list[int]:
    """Events in each lane; ValueError when the lanes are not a lanes batch."""
    if type(lanes) is not list or len(lanes) != len(LANE_WIDTHS):
        raise ValueError("not a lanes batch")
    counts = []
    for lane, width in zip(lanes, LANE_WIDTHS, strict=True):
        if type(lane) is not list or len(lane) % width:
            raise ValueError(f"a lane of {len(lane)} entries is not whole events of {width}")
        counts.append(len(lane) // width)
    return counts


def with_recorded(lanes: Lanes, recorded: bytes) -> Lanes:
    """`lanes` with the events of a NativeRecorder's take() bytes appended to lanes 1..5; ValueError if bad."""
    if not recorded:
        return lanes
    if _decode_recorded is None:
        raise ValueError("recorded events need the C recorder, which this install lacks")
    decoded = _decode_recorded(recorded, LANE_WIDTHS)
    return [lanes[0], *(lane + more if lane else more for lane, more in zip(lanes[1:], decoded[1:], strict=True))]


def lane_monos(lanes: Lanes) -> list[list[Any]]:
    """Each lane's CLOCK_MONOTONIC values, in lane order (slices, no loop per event)."""
    return [lanes[0][1::3], *(lane[0::width] for lane, width in zip(lanes[1:], LANE_WIDTHS[1:], strict=True))]


def lanes_flat(lanes: Lanes, offset: int) -> list[Any]:
    """A lanes batch as a flat batch [kind, wall, mono, fields, ...] in emit order (wall = mono + `offset`)."""
    lane_counts(lanes)
    events: list[tuple[Any, ...]] = []
    generic = lanes[0]
    for i in range(0, len(generic), 3):
        events.append((generic[i + 1], generic[i], generic[i + 2]))
    for kind, lane, width in zip(LANE_KINDS, lanes[1:], LANE_WIDTHS[1:], strict=True):
        for i in range(0, len(lane), width):
            events.append((lane[i], kind, tuple(lane[i + 1 : i + width])))
    try:
        events.sort(key=itemgetter(0))  # stable: ties keep lane order
    except TypeError:
        raise ValueError("a lanes batch with a non-integer clock") from None
    out: list[Any] = []
    for mono, kind, fields in events:
        out += (kind, mono + offset, mono, fields)
    return out


def keep_newest(lanes: Lanes, keep: int) -> tuple[Lanes, int]:
    """The lanes without their oldest events (by mono) beyond about `keep` (ties at the cut stay); and the dropped."""
    total = sum(lane_counts(lanes))
    if total <= keep:
        return lanes, 0
    monos = lane_monos(lanes)
    cut = sorted(chain.from_iterable(monos))[total - keep]  # events at or after the cut stay
    kept: Lanes = [
        [entry for i, mono in enumerate(lane_mono) if mono >= cut for entry in lane[i * width : (i + 1) * width]]
        for lane, width, lane_mono in zip(lanes, LANE_WIDTHS, monos, strict=True)
    ]
    return kept, total - sum(lane_counts(kept))


def plain_lanes(lanes: Lanes) -> Lanes:
    """A lanes batch with builtin values only, for marshal (the slow path of a non-builtin value somewhere)."""
    out: Lanes = []
    generic = lanes[0]
    plain_generic: list[Any] = []
    for i in range(0, len(generic), 3):
        kind = str(generic[i])
        plain_generic += (kind, generic[i + 1], _plain_fields(kind, generic[i + 2]))
    out.append(plain_generic)
    for kind, lane, width in zip(LANE_KINDS, lanes[1:], LANE_WIDTHS[1:], strict=True):
        plain_lane: list[Any] = []
        for i in range(0, len(lane), width):
            plain_lane += (lane[i], *plain_positional(kind, tuple(lane[i + 1 : i + width])))
        out.append(plain_lane)
    return out


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


def pack_lanes(lanes: Lanes, offset: int, stepped: bool) -> bytes:
    """Marshal (offset, stepped, lanes) in one call (non-builtin values take the slow path and become builtins)."""
    try:
        return marshal.dumps((offset, stepped, lanes), 4)
    except ValueError:  # an enum or another non-builtin value somewhere
        return marshal.dumps((offset, stepped, plain_lanes(lanes)), 4)


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
    return _layout_columns(kind, list(zip(*rows, strict=True)), seq_property)


def _layout_columns(kind: str, cols: list[Any], seq_property: str) -> dict[str, Any]:
    """Column name -> values, from one kind's values by layout position (`cols[j]`: every event's j-th value)."""
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

    try:  # the first property called `name` (mostly the first property), parsed by Arrow
        texts = pa.array([(u[0][1] if u[0][0] == name else _first_named(u, name)) if u else None for u in users],
                         pa.string())
        if pc.all(pc.match_substring_regex(texts, "^-?[0-9]{1,19}$")).as_py() is not False:  # plain decimal only
            return pc.cast(texts, pa.int64())  # out of range raises: one by one below
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, IndexError):
        pass
    return [publisher_seq(u, name) if u else None for u in users]  # an odd value somewhere: one by one, exactly


def _first_named(user_properties: Any, name: str) -> Any:
    """The value of the first user property called `name`, or None."""
    for key, value in user_properties:
        if key == name:
            return value
    return None


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
    columns, dropped = _joined_columns(pa, pieces)
    if len(pieces) > 1 and columns:
        back = pa.compute.sort_indices(pa.array(order, pa.int64()))
        columns = dict(zip(columns, pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
                           .take(back).columns, strict=True))
    return _in_schema_order(pa, columns, n), bad + dropped


def lanes_columns(pa: Any, lanes: Lanes, seq_property: str) -> tuple[Any, Any, list[Any], int]:
    """A lanes batch as Arrow arrays in emit order: (kind, mono ns, nullable columns in NULLABLE order, dropped).

    Each hot lane is sliced into columns; keyword events take the per-event path. The lanes are joined and put in
    emit order with one stable sort on mono.
    """
    counts = lane_counts(lanes)
    pieces: list[tuple[int, dict[str, Any]]] = []
    kinds: list[Any] = []
    monos: list[list[Any]] = []
    bad = 0
    generic = lanes[0]
    names, index = KINDS, KIND_INDEX  # the kind column's dictionary
    if generic:
        generic_kinds = [str(kind) for kind in generic[0::3]]
        outside = sorted(set(generic_kinds) - KIND_SET)  # only lane 0 can hold a kind outside the schema
        if outside:
            names = (*KINDS, *outside)
            index = {name: i for i, name in enumerate(names)}
        cols, bad = _dict_columns(generic_kinds, generic[2::3], seq_property)
        pieces.append((counts[0], cols))
        kinds.append(pa.array([index[kind] for kind in generic_kinds], pa.int32()))
        monos.append(generic[1::3])
    for kind, lane, width, count in zip(LANE_KINDS, lanes[1:], LANE_WIDTHS[1:], counts[1:], strict=True):
        if count:
            pieces.append((count, _layout_columns(kind, [lane[j::width] for j in range(1, width)], seq_property)))
            kinds.append(pa.repeat(pa.scalar(KIND_INDEX[kind], pa.int32()), count))
            monos.append(lane[0::width])
    columns, dropped = _joined_columns(pa, pieces)
    arrays = _in_schema_order(pa, columns, sum(counts))
    kind_array = pa.DictionaryArray.from_arrays(pa.concat_arrays(kinds) if kinds else pa.array([], pa.int32()),
                                                pa.array(names, pa.string()))
    mono_array = pa.array(list(chain.from_iterable(monos)), pa.int64())
    if len(pieces) > 1:
        order = pa.compute.sort_indices(mono_array)  # a stable sort: equal clocks keep lane order
        kind_array, mono_array = kind_array.take(order), mono_array.take(order)
        arrays = [array if array.null_count == len(array) else array.take(order) for array in arrays]
    return kind_array, mono_array, arrays, bad + dropped


def _joined_columns(pa: Any, pieces: list[tuple[int, dict[str, Any]]]) -> tuple[dict[str, Any], int]:
    """Each column present in some piece as one Arrow array over all pieces (null where a piece lacks it)."""
    columns: dict[str, Any] = {}
    bad = 0
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
    return columns, bad


def _in_schema_order(pa: Any, columns: dict[str, Any], n: int) -> list[Any]:
    """Every nullable column in NULLABLE order, all-null where `columns` lacks it."""
    return [columns[name] if name in columns else pa.nulls(n, arrow_type(pa, name)) for name in NULLABLE]
