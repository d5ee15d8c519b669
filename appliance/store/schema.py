"""Open the database file, check its integrity and apply the numbered migrations in migrations/NNNN_*.sql."""

from __future__ import annotations

import re
import sqlite3
from importlib import resources
from pathlib import Path

from .errors import StoreError

_MIGRATION_NAME = re.compile(r"^(\d{4})_[A-Za-z0-9_]+\.sql$")
DB_FILE_NAME = "broker.db"  # the node keeps its store at DATA_DIR/broker.db


def db_path(data_dir: Path | str) -> Path:
    """Where the node keeps its store inside its data directory."""
    return Path(data_dir) / DB_FILE_NAME


def migrations() -> list[tuple[int, str, str]]:
    """Every shipped migration as (version, file name, SQL), in version order; versions are 1, 2, 3... without gaps."""
    found: list[tuple[int, str, str]] = []
    for entry in resources.files("appliance.store").joinpath("migrations").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise StoreError(f"migration {name} is out of sequence: expected version {expected:04d}")
    return found


def latest_version() -> int:
    """The schema version this code writes."""
    return len(migrations())


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (explicit BEGIN/COMMIT) with WAL and synchronous=FULL."""
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
        else:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 5000")
        if not readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.close()
                raise StoreError(f"cannot switch the database to WAL mode (got {mode!r})", path=str(path))
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA cache_size = -8192")  # 8 MiB page cache
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open the database: {exc}", path=str(path)) from exc
    return conn


def check_integrity(conn: sqlite3.Connection, path: Path, *, full: bool = False) -> str:
    """Run PRAGMA quick_check (or integrity_check when `full`); raise StoreError unless it reports ok."""
    pragma = "integrity_check" if full else "quick_check"
    try:
        rows = [str(r[0]) for r in conn.execute(f"PRAGMA {pragma}(20)").fetchall()]
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"database is corrupt, {pragma} failed: {exc}", path=str(path)) from exc
    if rows != ["ok"]:
        problems = [line for row in rows for line in row.splitlines() if line and not line.startswith("***")]
        detail = "; ".join(problems[:3]) + (f"; ... {len(problems) - 3} more" if len(problems) > 3 else "")
        raise StoreError(
            f"database is corrupt ({pragma}: {detail}); restore it from a replica or backup, or move it aside",
            path=str(path),
        )
    return "ok"


def schema_version(conn: sqlite3.Connection) -> int:
    """The applied schema version (PRAGMA user_version)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, path: Path) -> list[int]:
    """Apply every migration newer than the file's user_version, each in its own transaction; return those applied."""
    current = schema_version(conn)
    shipped = migrations()
    if current > len(shipped):
        raise StoreError(
            f"database schema version {current} is newer than this software supports ({len(shipped)})", path=str(path)
        )
    applied: list[int] = []
    for version, name, sql in shipped[current:]:
        try:
            conn.executescript(f"BEGIN IMMEDIATE;\n{sql}\nPRAGMA user_version = {version};\nCOMMIT;")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(f"migration {name} failed: {exc}", path=str(path)) from exc
        applied.append(version)
    return applied


def prepare(path: Path, *, full_integrity_check: bool = False) -> int:
    """Create or open the file, check integrity, migrate to the latest version; return that version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = connect(path)
    try:
        check_integrity(conn, path, full=full_integrity_check)
        migrate(conn, path)
        return schema_version(conn)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot prepare the database: {exc}", path=str(path)) from exc
    finally:
        conn.close()
