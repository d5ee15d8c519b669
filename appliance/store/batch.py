"""Turn a list of pending operations into one SQLite transaction: elide dead rows, group runs, executemany."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from appliance.broker.model import DeliveryState, Message

from .rows import MessageRow, message_row

# Operation kinds. An operation is a tuple (kind, params); CALLBACK carries (callback, args) instead of SQL params.
SAVE_SESSION = 1
DELETE_SESSION = 2
SAVE_SUBSCRIPTION = 3
DELETE_SUBSCRIPTION = 4
ENQUEUE = 5
UPDATE_DELIVERY = 6
REMOVE_DELIVERY = 7
SAVE_RETAINED = 8
DELETE_RETAINED = 9
SAVE_INCOMING_QOS2 = 10
DELETE_INCOMING_QOS2 = 11
SET_META = 12
CALLBACK = 13
KV_PUT = 14
KV_DELETE = 15
KV_DELETE_NS = 16

Op = tuple[int, Any]


def _same(value: Any) -> Any:
    return value


# sqlite3 binds exact int/float/str without lookups, but sends None, bytes, bool and IntEnum through its adapter
# protocol, failing two attribute lookups per value. Registering the identity (or int) finds them in one dict lookup;
# the stored values are exactly what sqlite3 would have stored anyway.
sqlite3.register_adapter(type(None), _same)
sqlite3.register_adapter(bytes, bytes)
sqlite3.register_adapter(bool, int)
sqlite3.register_adapter(DeliveryState, int)

_SQL: dict[int, tuple[str, ...]] = {
    SAVE_SESSION: ("INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?,?,?)",),
    DELETE_SESSION: (
        "DELETE FROM sessions WHERE client_id = ?",
        "DELETE FROM subscriptions WHERE client_id = ?",
        "DELETE FROM queue WHERE client_id = ?",
        "DELETE FROM incoming_qos2 WHERE client_id = ?",
    ),
    SAVE_SUBSCRIPTION: ("INSERT OR REPLACE INTO subscriptions VALUES (?,?,?,?,?,?,?)",),
    DELETE_SUBSCRIPTION: ("DELETE FROM subscriptions WHERE client_id = ? AND topic_filter = ?",),
    ENQUEUE: ("INSERT OR REPLACE INTO queue VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",),
    UPDATE_DELIVERY: ("UPDATE queue SET state = ?, packet_id = ? WHERE client_id = ? AND seq = ?",),
    REMOVE_DELIVERY: ("DELETE FROM queue WHERE client_id = ? AND seq = ?",),
    SAVE_RETAINED: ("INSERT OR REPLACE INTO retained VALUES (?,?,?,?,?,?,?,?,?)",),
    DELETE_RETAINED: ("DELETE FROM retained WHERE topic = ?",),
    SAVE_INCOMING_QOS2: ("INSERT OR REPLACE INTO incoming_qos2 VALUES (?,?,?,?,?,?,?,?,?,?,?)",),
    DELETE_INCOMING_QOS2: ("DELETE FROM incoming_qos2 WHERE client_id = ? AND packet_id = ?",),
    SET_META: ("INSERT OR REPLACE INTO meta VALUES (?,?)",),
    KV_PUT: ("INSERT OR REPLACE INTO cluster_kv VALUES (?,?,?)",),
    KV_DELETE: ("DELETE FROM cluster_kv WHERE ns = ? AND key = ?",),
    KV_DELETE_NS: ("DELETE FROM cluster_kv WHERE ns = ?",),
}

_NO_MESSAGE: MessageRow = (None, None, None, None, None, None, None, None, None)  # type: ignore[assignment]


def fold_updates(ops: list[Op]) -> tuple[list[Op], int]:
    """Merge each UPDATE_DELIVERY into the latest ENQUEUE of the same row earlier in the batch; return (ops, merged).

    Only ENQUEUE creates queue rows, so writing the update into that insert gives the same final table state.
    """
    latest: dict[tuple[str, int], int] = {}
    out: list[Op] = []
    merged = 0
    for op in ops:
        kind = op[0]
        if kind == ENQUEUE:
            p = op[1]
            latest[(p[0], p[1])] = len(out)
        elif kind == UPDATE_DELIVERY:
            state, packet_id, client_id, seq = op[1]
            i = latest.get((client_id, seq))
            if i is not None:
                e = out[i][1]
                out[i] = (ENQUEUE, (e[0], e[1], e[2], e[3], e[4], e[5], packet_id, state, e[8]))
                merged += 1
                continue
        out.append(op)
    return out, merged


def elide(ops: list[Op]) -> tuple[list[Op], int]:
    """Drop enqueue/update ops whose row a later op in the same batch removes; return (kept ops, number dropped).

    The later REMOVE_DELIVERY is kept, so the final table state equals running every op in order.
    """
    removed_later: set[tuple[str, int]] = set()
    keep: list[Op] = []
    dropped = 0
    for op in reversed(ops):
        kind = op[0]
        if kind == REMOVE_DELIVERY:
            removed_later.add(op[1])
        elif kind in (ENQUEUE, UPDATE_DELIVERY):
            key = (op[1][0], op[1][1]) if kind == ENQUEUE else (op[1][2], op[1][3])
            if key in removed_later:
                dropped += 1
                continue
        keep.append(op)
    keep.reverse()
    return keep, dropped


def coalesce(ops: list[Op]) -> tuple[list[Op], int]:
    """fold_updates then elide, each only when the batch holds the op kinds it works on; return (ops, ops saved)."""
    kinds = {op[0] for op in ops}
    saved = 0
    if UPDATE_DELIVERY in kinds and ENQUEUE in kinds:
        ops, merged = fold_updates(ops)
        saved += merged
    if REMOVE_DELIVERY in kinds:
        ops, dropped = elide(ops)
        saved += dropped
    return ops, saved


def _message_cells(message: Message, cache: dict[int, MessageRow]) -> MessageRow:
    """The message columns, serialised once per message object per batch (fan-out shares one Message)."""
    key = id(message)
    cells = cache.get(key)
    if cells is None:
        cells = message_row(message)
        cache[key] = cells
    return cells


def _params(kind: int, raw: list[Any], cache: dict[int, MessageRow]) -> list[Any]:
    """Expand captured op params to full SQL rows where serialisation was deferred to the writer thread."""
    if kind == ENQUEUE:
        # raw: (client_id, seq, message, qos, retain, subscription_ids_text, packet_id, state, attempts)
        return [(p[0], p[1], *_message_cells(p[2], cache), *p[3:]) for p in raw]
    if kind == SAVE_RETAINED:
        rows = []
        for m in raw:
            msg_id, topic, *rest = _message_cells(m, cache)
            rows.append((topic, msg_id, *rest))
        return rows
    if kind == SAVE_INCOMING_QOS2:
        # raw: (client_id, packet_id, message | None)
        return [(c, pid, *(_message_cells(m, cache) if m is not None else _NO_MESSAGE)) for c, pid, m in raw]
    if kind == DELETE_SESSION:
        return [(c,) for c in raw]
    if kind in (DELETE_RETAINED, KV_DELETE_NS):
        return [(t,) for t in raw]
    return raw


def split(ops: list[Op]) -> tuple[list[tuple[Callable[..., Any], tuple[Any, ...]]], list[Op]]:
    """Separate a batch into its after_commit callbacks and its writes, each in call order."""
    callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    writes: list[Op] = []
    for op in ops:
        if op[0] == CALLBACK:
            callbacks.append(op[1])
        else:
            writes.append(op)
    return callbacks, writes


_DELETE_RANGE = "DELETE FROM queue WHERE client_id = ? AND seq BETWEEN ? AND ?"


def remove_rows(conn: sqlite3.Connection, keys: list[tuple[str, int]]) -> None:
    """Delete queue rows (client_id, seq): one range delete per run of consecutive seqs of a client."""
    by_client: dict[str, list[int]] = {}
    for client_id, seq in keys:
        seqs = by_client.get(client_id)
        if seqs is None:
            by_client[client_id] = [seq]
        else:
            seqs.append(seq)
    ranges: list[tuple[str, int, int]] = []
    for client_id, seqs in by_client.items():
        seqs.sort()
        lo = hi = seqs[0]
        for seq in seqs[1:]:
            if seq > hi + 1:
                ranges.append((client_id, lo, hi))
                lo = seq
            hi = seq
        ranges.append((client_id, lo, hi))
    conn.executemany(_DELETE_RANGE, ranges)


def _apply_queue_only(conn: sqlite3.Connection, writes: list[Op]) -> tuple[int, int] | None:
    """apply() in one pass for a batch of queue inserts and removals only (the QoS1 flow); None, having run nothing,
    when the batch holds any other kind.

    Removals run first as range deletes; each insert runs unless a later removal in the batch deletes its row, and of
    inserts of one row the last wins: rows of distinct keys commute, so the end state equals running every op in order.
    """
    rows: dict[tuple[str, int], Any] = {}
    removals: list[tuple[str, int]] = []
    elided = 0
    for kind, p in writes:
        if kind == ENQUEUE:
            rows[(p[0], p[1])] = p
        elif kind == REMOVE_DELIVERY:
            removals.append(p)
            if rows.pop(p, None) is not None:
                elided += 1
        else:
            return None
    if removals:
        remove_rows(conn, removals)
    if rows:
        texts: dict[int, str | None] = {}
        conn.executemany(_SQL[ENQUEUE][0], [(p[0], p[1], *message_row(p[2], texts), *p[3:]) for p in rows.values()])
    return len(removals) + len(rows), elided


def apply(conn: sqlite3.Connection, writes: list[Op]) -> tuple[int, int]:
    """Run `writes` inside the caller's transaction; return (ops executed, ops saved by coalescing).

    After coalescing no insert or update of a row precedes its removal, so every removal runs first (deletes
    commute), as range deletes; the rest run in call order, one executemany per run of one kind.
    """
    done = _apply_queue_only(conn, writes)
    if done is not None:
        return done
    writes, dropped = coalesce(writes)
    executed = len(writes)
    keys = [op[1] for op in writes if op[0] == REMOVE_DELIVERY]
    if keys:
        remove_rows(conn, keys)
        writes = [op for op in writes if op[0] != REMOVE_DELIVERY]
    cache: dict[int, MessageRow] = {}
    i = 0
    n = len(writes)
    while i < n:
        kind = writes[i][0]
        j = i + 1
        while j < n and writes[j][0] == kind:
            j += 1
        params = _params(kind, [op[1] for op in writes[i:j]], cache)
        for sql in _SQL[kind]:
            conn.executemany(sql, params)
        i = j
    return executed, dropped
