"""`appliance store inspect`: a read-only report of a store file (schema version, counts, queue depths, integrity)."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

import sqlite_utils

from .errors import StoreError
from .schema import check_integrity, db_path, latest_version, schema_version

TABLES = ("sessions", "subscriptions", "queue", "retained", "incoming_qos2", "meta")
MAX_SESSIONS_LISTED = 50


def inspect(db_file: Path | str, *, full: bool = False) -> str:
    """A human-readable report of the store at `db_file`; StoreError if it is missing, unreadable or corrupt."""
    path = Path(db_file)
    if not path.is_file():
        raise StoreError("no store file", path=str(path))
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store: {exc}", path=str(path)) from exc
    try:
        lines = [f"store: {path}"]
        try:
            version = schema_version(conn)
            journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot read the store: {exc}", path=str(path)) from exc
        lines.append(f"schema version: {version} (this software: {latest_version()})")
        lines.append(f"journal mode: {journal}")
        try:
            integrity = check_integrity(conn, path, full=full)
        except StoreError as exc:
            integrity = f"FAILED: {exc}"
        lines.append(f"integrity ({'integrity_check' if full else 'quick_check'}): {integrity}")
        db = sqlite_utils.Database(conn)
        present = set(db.table_names())
        lines.append("rows:")
        for name in TABLES:
            lines.append(f"  {name:<14} {_count(db, name) if name in present else 'missing'}")
        if "sessions" in present and "queue" in present:
            try:
                lines.append(_sessions_report(conn))
            except sqlite3.DatabaseError as exc:
                lines.append(f"sessions: unreadable ({exc})")
        if integrity != "ok":
            raise StoreError("\n".join(lines))
        return "\n".join(lines)
    finally:
        conn.close()


def _count(db: sqlite_utils.Database, table: str) -> str:
    """Row count of `table`, or why it cannot be read."""
    try:
        return str(db[table].count)
    except sqlite3.DatabaseError as exc:
        return f"unreadable ({exc})"


def _sessions_report(conn: sqlite3.Connection) -> str:
    """Sessions with their subscription count and queue depth (deepest first)."""
    rows = conn.execute(
        """
        SELECT s.client_id, s.protocol_version, s.expiry_interval, s.disconnected_at,
               (SELECT count(*) FROM subscriptions b WHERE b.client_id = s.client_id),
               (SELECT count(*) FROM queue q WHERE q.client_id = s.client_id),
               (SELECT count(*) FROM queue q WHERE q.client_id = s.client_id AND q.state != 0)
        FROM sessions s
        ORDER BY 6 DESC, s.client_id
        """
    ).fetchall()
    out = [f"sessions: {len(rows)}"]
    if rows:
        out.append(f"  {'client id':<32} {'ver':>3} {'expiry':>10} {'subs':>5} {'queued':>8} {'inflight':>8}  state")
    for client_id, version, expiry, disconnected_at, subs, depth, inflight in rows[:MAX_SESSIONS_LISTED]:
        state = "connected" if disconnected_at is None else "offline"
        out.append(f"  {client_id:<32} {version:>3} {expiry:>10} {subs:>5} {depth:>8} {inflight:>8}  {state}")
    if len(rows) > MAX_SESSIONS_LISTED:
        out.append(f"  ... {len(rows) - MAX_SESSIONS_LISTED} more")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `appliance store inspect --data-dir DIR [--full]`; 0 when the store is sound, 2 otherwise."""
    parser = argparse.ArgumentParser(prog="appliance store inspect", description="Report on a node's durable store.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-dir", type=Path, help="the node's data directory")
    where.add_argument("--db", type=Path, help="a store file")
    parser.add_argument("--full", action="store_true", help="PRAGMA integrity_check instead of quick_check")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["inspect"]:  # `appliance store inspect ...` hands over everything after `store`
        argv = argv[1:]
    args = parser.parse_args(argv)
    target = args.db if args.db is not None else db_path(args.data_dir)
    try:
        print(inspect(target, full=args.full))
    except StoreError as exc:
        print(f"appliance store inspect: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
