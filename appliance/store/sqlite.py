"""SqliteStore: the broker's durable Store, SQLite in WAL mode with synchronous=FULL and group commit.

Usage (the node's start-up and shutdown)::

    store = SqliteStore(db_path(data_dir), on_fatal=node.fail)  # nothing touches the disk yet
    store.open()        # lock DATA_DIR/broker.db.lock, create/quick_check/migrate; StoreError if unusable
    snapshot = store.load()            # everything recovered, before listeners open
    store.start(loop)                  # writer + checkpoint threads; loop defaults to the running loop
    store.enqueue(...); store.after_commit(send_puback, packet_id)   # hot path, never blocks
    await store.async_close()          # or store.close(): commits what is pending, runs callbacks, stops

Constructor: SqliteStore(path, *, loop=None, on_fatal=None, batch_max=20_000, full_integrity_check=False,
pragmas=None). Write methods only append an operation to a deque. One writer thread takes everything pending (at
most `batch_max` ops), folds same-batch updates into their insert and drops rows removed later in the batch, runs
the rest in ONE transaction (queue removals first, as range deletes; everything else in call order, executemany
per run of one kind), commits (fsync), then hands the after_commit callbacks registered among those ops to the
loop with a single call_soon_threadsafe. Without a loop
(scripts, tests) the callbacks run on the writer thread. A failed write or commit (disk full, I/O error) is fatal:
pending callbacks are dropped (no PUBACK goes out), every later write raises StoreError, and `on_fatal(StoreError)`
is called on the loop so the node can exit non-zero. save_session writes the session row only; subscriptions are
written by save_subscription / delete_subscription. load() raises each session's next_seq above its highest queued
seq. WAL checkpoints run on their own thread (PASSIVE); the writer forces a RESTART only if the WAL keeps growing.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.broker.ports import Snapshot, Store

from . import batch as ops
from .checkpoint import Checkpointer
from .errors import StoreError
from .filelock import StoreLock
from .loader import load_snapshot
from .rows import session_row, subscription_row
from .schema import connect, prepare
from .stats import CommitStats

FatalHandler = Callable[[StoreError], Any]
CHECKPOINT_EVERY_COMMITS = 64
WAL_SIZE_LIMIT = 64 * 2**20  # bytes the WAL file is truncated to when it is reset


class SqliteStore:
    """A Store (appliance.broker.ports) backed by one SQLite file, with one writer thread doing group commit."""

    def __init__(
        self,
        path: Path | str,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        on_fatal: FatalHandler | None = None,
        batch_max: int = 20_000,
        full_integrity_check: bool = False,
        pragmas: dict[str, int | str] | None = None,
    ) -> None:
        self.path = Path(path)
        self._loop = loop
        self._on_fatal = on_fatal
        self._batch_max = max(1, batch_max)
        self._full_integrity_check = full_integrity_check
        self._pragmas = dict(pragmas or {})  # extra PRAGMAs for the writer connection (e.g. max_page_count)
        # Hot path: deque.append is atomic, so producers take no lock; the writer pops from the left.
        self._pending: deque[ops.Op] = deque()
        self._writer_idle = False
        self._wake = threading.Event()
        self._stopping = False
        self._refusal: StoreError | None = None  # set once closed or failed: every write raises it
        self._thread: threading.Thread | None = None
        self._opened = False
        self._lock = StoreLock(self.path)
        self._failure: StoreError | None = None
        self._stats = CommitStats()
        self._checkpointer = Checkpointer(self.path)
        self._commits_since_poke = 0
        self._wal_restarts = 0
        self.schema_version = 0

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Create or open the file, run the integrity check and the migrations; raise StoreError on failure."""
        if not self._opened:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._lock.acquire()
            except OSError as exc:
                raise StoreError(f"cannot open the store: {exc.strerror or exc}", path=str(self.path)) from exc
            try:
                self.schema_version = prepare(self.path, full_integrity_check=self._full_integrity_check)
            except BaseException:
                self._lock.release()
                raise
            self._opened = True

    def load(self) -> Snapshot:
        """Read everything durable (call before start(); later calls see only what is already committed)."""
        if self._refusal is not None:
            raise self._refusal
        self.open()
        conn = connect(self.path)
        try:
            return load_snapshot(conn)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot load the database: {exc}", path=str(self.path)) from exc
        finally:
            conn.close()

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the writer thread; callbacks go to `loop`, else the constructor's loop, else the running loop."""
        if self._thread is not None:
            return
        if self._refusal is not None:
            raise self._refusal
        self.open()
        self._loop = loop or self._loop
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self._loop = None  # no loop: callbacks run on the writer thread
        conn = connect(self.path)
        try:
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # checkpoints run on the Checkpointer's thread
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
            for name, value in self._pragmas.items():
                conn.execute(f"PRAGMA {name} = {value!r}" if isinstance(value, str) else f"PRAGMA {name} = {value}")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot configure the database: {exc}", path=str(self.path)) from exc
        self._checkpointer.start()
        self._thread = threading.Thread(target=self._run, args=(conn,), name="store-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Commit everything pending, release its callbacks, stop the writer thread (blocks until done)."""
        if self._refusal is not None and self._thread is None:
            return
        if self._thread is None and self._pending:
            self.start()
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._checkpointer.stop()
        self._lock.release()
        if self._refusal is None:
            self._refusal = StoreError("store is closed", path=str(self.path))

    async def async_close(self) -> None:
        """close() without blocking the loop, so the released callbacks (PUBACKs) run before this returns."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)
        await asyncio.sleep(0)

    @property
    def pending(self) -> int:
        """Operations queued and not yet taken by the writer (cheap enough for per-message back-pressure checks)."""
        return len(self._pending)

    @property
    def failure(self) -> StoreError | None:
        """The fatal write error, once one happened."""
        return self._failure

    def stats(self) -> dict[str, float]:
        """commits, ops, ops_elided, callbacks, batch_last/mean/max, commit_latency_mean/p99/max_ms, fsyncs_per_s..."""
        out = self._stats.snapshot(len(self._pending), self._failure is not None)
        out["checkpoints"] = float(self._checkpointer.checkpoints)
        out["checkpoint_errors"] = float(self._checkpointer.errors)
        out["wal_frames"] = float(self._checkpointer.wal_frames)
        out["wal_restarts"] = float(self._wal_restarts)
        return out

    # -- Store protocol: writes (queued, never blocking) ------------------------------------------------------

    def _submit(self, op: ops.Op) -> None:
        if self._refusal is not None:
            raise self._refusal
        self._pending.append(op)
        if self._writer_idle:
            self._writer_idle = False
            self._wake.set()

    def save_session(self, record: SessionRecord) -> None:
        """Insert or replace the session row (not its subscriptions)."""
        self._submit((ops.SAVE_SESSION, session_row(record)))

    def delete_session(self, client_id: str) -> None:
        """Delete the session with its subscriptions, queue and incoming QoS2 state."""
        self._submit((ops.DELETE_SESSION, client_id))

    def save_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None:
        """Insert or replace one subscription."""
        self._submit((ops.SAVE_SUBSCRIPTION, subscription_row(client_id, topic_filter, options)))

    def delete_subscription(self, client_id: str, topic_filter: str) -> None:
        """Delete one subscription."""
        self._submit((ops.DELETE_SUBSCRIPTION, (client_id, topic_filter)))

    def enqueue(self, client_id: str, delivery: Delivery) -> None:
        """Insert (or replace) queue row (client_id, delivery.seq); the delivery's mutable fields are captured now."""
        if self._refusal is not None:
            raise self._refusal
        d = delivery
        ids = d.subscription_ids
        self._pending.append(
            (
                ops.ENQUEUE,
                (
                    client_id,
                    d.seq,
                    d.message,
                    d.qos,
                    d.retain,
                    ",".join(map(str, ids)) if ids else None,
                    d.packet_id,
                    d.state,
                    d.attempts,
                ),
            )
        )
        if self._writer_idle:
            self._writer_idle = False
            self._wake.set()

    def update_delivery(self, client_id: str, seq: int, state: DeliveryState, packet_id: int | None) -> None:
        """Record a queued delivery's new outbound state and packet id."""
        if self._refusal is not None:
            raise self._refusal
        self._pending.append((ops.UPDATE_DELIVERY, (state, packet_id, client_id, seq)))
        if self._writer_idle:
            self._writer_idle = False
            self._wake.set()

    def remove_delivery(self, client_id: str, seq: int) -> None:
        """Delete a queue row (on the subscriber's PUBACK / PUBCOMP, or on expiry / drop)."""
        if self._refusal is not None:
            raise self._refusal
        self._pending.append((ops.REMOVE_DELIVERY, (client_id, seq)))
        if self._writer_idle:
            self._writer_idle = False
            self._wake.set()

    def save_retained(self, message: Message) -> None:
        """Insert or replace the retained message of message.topic."""
        self._submit((ops.SAVE_RETAINED, message))

    def delete_retained(self, topic: str) -> None:
        """Delete the retained message of `topic`."""
        self._submit((ops.DELETE_RETAINED, topic))

    def save_incoming_qos2(self, client_id: str, packet_id: int, message: Message | None) -> None:
        """Hold an incoming QoS2 packet id (with its message until routed, None after) until PUBREL."""
        self._submit((ops.SAVE_INCOMING_QOS2, (client_id, packet_id, message)))

    def delete_incoming_qos2(self, client_id: str, packet_id: int) -> None:
        """Release an incoming QoS2 packet id (on PUBREL)."""
        self._submit((ops.DELETE_INCOMING_QOS2, (client_id, packet_id)))

    def set_meta(self, key: str, value: str) -> None:
        """Insert or replace a node-level key/value."""
        self._submit((ops.SET_META, (key, value)))

    # -- cluster state (appliance/store/migrations/0002_cluster.sql) -------------------------------------------

    def kv_put(self, ns: str, key: str, value: bytes) -> None:
        """Insert or replace one namespaced cluster value."""
        self._submit((ops.KV_PUT, (ns, key, value)))

    def kv_delete(self, ns: str, key: str) -> None:
        """Delete one namespaced cluster value."""
        self._submit((ops.KV_DELETE, (ns, key)))

    def kv_delete_ns(self, ns: str) -> None:
        """Delete every value of a namespace."""
        self._submit((ops.KV_DELETE_NS, ns))

    def load_kv(self) -> dict[str, dict[str, bytes]]:
        """Every committed cluster value, ns -> key -> value (call at start-up, like load())."""
        self.open()
        conn = connect(self.path)
        try:
            out: dict[str, dict[str, bytes]] = {}
            for ns, key, value in conn.execute("SELECT ns, key, value FROM cluster_kv ORDER BY ns, key"):
                out.setdefault(ns, {})[key] = bytes(value)
            return out
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot load the cluster state: {exc}", path=str(self.path)) from exc
        finally:
            conn.close()

    def after_commit(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run callback(*args) on the loop once every write queued before this call has committed."""
        if self._refusal is not None:
            raise self._refusal
        self._pending.append((ops.CALLBACK, (callback, args)))
        if self._writer_idle:
            self._writer_idle = False
            self._wake.set()

    # -- writer thread -----------------------------------------------------------------------------------------

    def _take(self) -> list[ops.Op] | None:
        """Block until work is pending; take at most batch_max ops in call order. None means stop."""
        pending = self._pending
        while True:
            n = len(pending)
            if n:
                popleft = pending.popleft
                return [popleft() for _ in range(min(n, self._batch_max))]
            if self._stopping:
                return None
            self._wake.clear()
            self._writer_idle = True
            if pending or self._stopping:  # raced with a producer that saw us busy: go again
                self._writer_idle = False
                continue
            self._wake.wait()
            self._writer_idle = False

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                taken = self._take()
                if taken is None:
                    return
                if not self._commit(conn, taken):
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, taken: list[ops.Op]) -> bool:
        """Write one batch and release its callbacks; on failure go fatal and return False."""
        callbacks, writes = ops.split(taken)
        if writes:
            started = time.monotonic()
            try:
                conn.execute("BEGIN")
                _executed, elided = ops.apply(conn, writes)
                conn.execute("COMMIT")
            except Exception as exc:  # sqlite3.Error (disk full, I/O error) or a bad value from the broker
                self._fail(conn, exc)
                return False
            self._stats.record(len(writes), elided, len(callbacks), started, time.monotonic())
        else:
            self._stats.record_callbacks_only(len(callbacks))
        if callbacks:
            self._release(callbacks)
        if writes:
            self._after_commit_housekeeping(conn)
        return True

    def _after_commit_housekeeping(self, conn: sqlite3.Connection) -> None:
        """Poke the checkpointer now and then; if the WAL outgrows passive checkpoints, restart it here."""
        self._commits_since_poke += 1
        if self._commits_since_poke >= CHECKPOINT_EVERY_COMMITS:
            self._commits_since_poke = 0
            self._checkpointer.poke()
        if self._checkpointer.backlog_high:
            self._checkpointer.wal_frames = 0
            try:
                conn.execute("PRAGMA wal_checkpoint(RESTART)")
                self._wal_restarts += 1
            except sqlite3.Error:
                pass  # busy or failing: the data stays safe in the WAL; the next commit reports real trouble

    def _release(self, callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
        loop = self._loop
        if loop is None:
            _run_callbacks(None, callbacks)
            return
        try:
            loop.call_soon_threadsafe(_run_callbacks, loop, callbacks)
        except RuntimeError:
            pass  # the loop is closed: nobody is left to acknowledge anything

    def _fail(self, conn: sqlite3.Connection, exc: BaseException) -> None:
        """Stop accepting writes, drop every pending callback, report to on_fatal."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        error = StoreError(f"write to the database failed, refusing further writes: {exc}", path=str(self.path))
        error.__cause__ = exc
        self._failure = error
        self._refusal = StoreError(f"store refuses writes after a failed commit: {exc}", path=str(self.path))
        self._stopping = True
        self._pending.clear()  # their callbacks (PUBACK / PUBREC) must never run
        handler = self._on_fatal
        if handler is None:
            return
        loop = self._loop
        if loop is None:
            handler(error)
            return
        try:
            loop.call_soon_threadsafe(handler, error)
        except RuntimeError:
            handler(error)


def _run_callbacks(
    loop: asyncio.AbstractEventLoop | None, callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> None:
    """Run released callbacks in order; one raising does not stop the rest."""
    for callback, args in callbacks:
        try:
            callback(*args)
        except Exception as exc:
            if loop is not None:
                loop.call_exception_handler({"message": "store after_commit callback failed", "exception": exc})
            else:
                import traceback

                traceback.print_exception(exc)


if TYPE_CHECKING:

    def _implements_store(store: SqliteStore) -> Store:
        """mypy proves here that SqliteStore satisfies the broker's Store port."""
        return store
