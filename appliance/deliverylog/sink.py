"""DeliveryLog: the broker's EventSink; emit() appends to a queue, a background thread writes segments."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .batch import LANE_KINDS, LANE_WIDTHS, Lanes, NativeRecorder, keep_newest, lane_counts, with_recorded
from .identity import Identity, clock_sync_probe, read_boot_id
from .positional import LAYOUTS
from .schema import EMIT_FIELDS, KIND_SET, field_problem
from .worker import WriterProcess
from .writer import FULL_MESSAGE_KINDS, DeliveryLogError, Limits, SegmentWriter, WriterStats

_time_ns = time.time_ns
_mono_ns = time.monotonic_ns
STEP_NS = 1_000_000  # a change of the wall-minus-monotonic offset beyond this between two drains is a clock step
_PAIR_NS = 2_000  # a clock-offset reading whose two monotonic reads lie further apart is read again


def _clock_offset() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC now, in ns (from the tightest of a few paired reads)."""
    best_gap, offset = 1 << 62, 0
    for _ in range(8):
        m0 = _mono_ns()
        wall = _time_ns()
        m1 = _mono_ns()
        if m1 - m0 < best_gap:
            best_gap, offset = m1 - m0, wall - (m0 + m1) // 2
        if best_gap <= _PAIR_NS:
            break
    return offset


def _user_properties_problem(value: Any) -> str | None:
    """Why `value` is not a received event's user properties (None, or (name, value) string pairs), or None."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(p, tuple) and len(p) == 2 and all(type(x) is str for x in p) for p in value):
        return f"user properties must be None or (name, value) string pairs, got {value!r}"
    return None


def _lane_recorder(extend: Callable[[tuple[Any, ...]], None]) -> Callable[..., None]:
    """A record_<kind> for the pure-Python lanes: the clock read now, then the values, appended inline."""
    clock = _mono_ns

    def record(*values: Any) -> None:
        extend((clock(), *values))

    return record


def _message_tuple(msg: Any) -> tuple[Any, ...]:
    """A Message's schema values (msg_id, publisher, topic, qos, retain, payload size, user properties)."""
    props = getattr(msg, "properties", None)
    user = props.user_properties if props is not None else None
    return (msg.msg_id, msg.publisher, msg.topic, msg.qos, msg.retain, len(msg.payload), tuple(user) if user else ())


class DeliveryLog:
    """An EventSink writing schema-v1 delivery-log segments for one node (or one client, source="client").

    emit() only timestamps and appends to a list (a lane: one per hot kind, their values inline, see batch.py); a
    thread drains the lanes every `flush_interval_s` into the writer, a child process unless process=False.
    Records reach the file at least every `sync_every_s`, and at once on flush().
    Fields are the schema's nullable ones, plus `message=` (a broker Message, expanded on the writer thread).
    With `native` (the default where the C recorder is built, batch.NativeRecorder) the hot kinds' values are
    encoded into one buffer by C code instead, so the drain hands bytes on without marshalling per value.
    Closed segments are Parquet (`format="parquet"`, the open one journaled as checksummed binary batches) or gzip
    JSON Lines (`format="jsonl.gz"`, the open one the same gzip stream, at `gzip_level`, default 6).
    """

    record_received: Callable[..., None]  # the EventSink's hot events: the C recorder's methods, or _lane_recorder
    record_committed: Callable[..., None]
    record_routed: Callable[..., None]
    record_delivered: Callable[..., None]
    record_acked: Callable[..., None]

    def __init__(
        self,
        directory: str,
        *,
        fleet: str,
        device: str,
        node: str,
        firmware: str,
        boot_id: str | None = None,
        source: str = "broker",
        clock_synced: bool | Callable[[], bool] | None = None,
        segment_bytes: int = 4 << 20,
        segment_age_s: float = 300.0,
        budget_bytes: int = 256 << 20,
        min_free_bytes: int = 32 << 20,
        fsync_every_s: float | None = 10.0,
        sync_every_s: float = 0.5,
        flush_interval_s: float = 0.05,
        max_backlog: int = 100_000,
        format: str = "parquet",
        gzip_level: int | None = None,
        seq_property: str = "seq",
        strict: bool = False,
        process: bool = True,
        native: bool | None = None,
    ) -> None:
        if source not in ("broker", "client"):
            raise DeliveryLogError(f"source must be 'broker' or 'client', not {source!r}")
        if native and NativeRecorder is None:
            raise DeliveryLogError("native=True, but the C recorder is not built (a C compiler at install time)")
        identity = Identity(fleet, device, node, firmware, boot_id or read_boot_id(), source)
        probe = clock_synced if callable(clock_synced) else clock_sync_probe(clock_synced)
        limits = Limits(
            segment_bytes=segment_bytes, segment_age_s=segment_age_s, budget_bytes=budget_bytes,
            fsync_every_s=fsync_every_s, flush_every_s=sync_every_s, min_free_bytes=min_free_bytes, format=format,
            level=gzip_level if gzip_level is not None else 6,
        )
        self.identity = identity
        self._writer: SegmentWriter | WriterProcess
        if process:  # JSON and gzip in a child process: the broker's GIL only sees emit() and marshal
            if callable(clock_synced):
                raise DeliveryLogError("a clock_synced callable needs process=False (give a bool, or None to detect)")
            self._writer = WriterProcess(directory, identity, limits, clock_synced, seq_property)
        else:
            self._writer = SegmentWriter(directory, identity, limits, probe, seq_property)
        # emitters extend a lane at the end, only the writer thread takes from the front; lane 0: keyword events
        self._lanes: Lanes = [[] for _ in range(1 + len(LANE_KINDS))]
        use_native = NativeRecorder is not None if native is None else native
        # at most 4 x the backlog held: beyond it (the drain itself blocked) new hot events are counted, not kept
        self._recorder = NativeRecorder(LANE_WIDTHS, 4 * max_backlog) if use_native else None
        self._queue_to_lanes()
        self._interval = flush_interval_s
        self._max_backlog = max_backlog
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._requested = 0  # flush generations asked for / completed
        self._completed = 0
        self._closing = False
        self._rotate_wanted = False
        self.discarded = 0  # events emitted after close() or after the writer failed
        self._error: BaseException | None = None
        if strict:
            self.emit = self._emit_strict  # type: ignore[method-assign]
            self.received = self._checked("received", self.received)  # type: ignore[method-assign]
            for kind in LANE_KINDS:
                name = f"record_{kind}"
                setattr(self, name, self._checked_record(kind, getattr(self, name)))
        self._offset_before = _clock_offset()  # read before the first slice: brackets every queued event's instant
        self._thread = threading.Thread(target=self._run, name="deliverylog-writer", daemon=True)
        self._thread.start()

    def emit(self, kind: str, message: Any = None, **fields: Any) -> None:
        """Record one event; its clock is read now (_drain), field expansion, JSON and gzip happen elsewhere.

        A `message=` Message is reduced here to its msg_id, or for FULL_MESSAGE_KINDS (a message's first event) to a
        tuple of plain values, so the queue keeps no broker object alive. The event goes to the queue as three flat
        entries (kind, mono, fields) in one C call.
        """
        if message is not None:
            if kind in FULL_MESSAGE_KINDS:
                fields["message"] = _message_tuple(message)
            elif "msg_id" not in fields:
                fields["msg_id"] = message.msg_id
        self._extend((kind, _mono_ns(), fields))

    # -- the hot events: positional, their values inline in their kind's lane (batch.LANE_KINDS), no tuple or dict --

    def received(self, message: Any, publisher_packet_id: int | None) -> None:
        """A message accepted from a publisher (its first event: every message field)."""
        props = message.properties
        self.record_received(message.msg_id, message.publisher, message.topic, message.qos, message.retain,
                             len(message.payload), props.user_properties or None if props is not None else None,
                             publisher_packet_id)

    def committed(self, message: Any) -> None:
        """The message is on disk here (the broker calls record_committed)."""
        self.record_committed(message.msg_id)

    def routed(self, message: Any, subscriber: str, topic_filter: str, qos: int) -> None:
        """The message matched one subscriber's filter (the broker calls record_routed)."""
        self.record_routed(message.msg_id, subscriber, topic_filter, qos)

    def delivered(self, message: Any, subscriber: str, qos: int, dup: bool, attempt: int) -> None:
        """A PUBLISH of the message went to the subscriber (the broker calls record_delivered)."""
        self.record_delivered(message.msg_id, subscriber, qos, dup, attempt)

    def acked(self, message: Any, subscriber: str, qos: int) -> None:
        """The subscriber acknowledged the message: PUBACK / PUBCOMP (the broker calls record_acked)."""
        self.record_acked(message.msg_id, subscriber, qos)

    def _queue_to_lanes(self) -> None:
        """Point every emitter at its lane: the hot ones at the C recorder's methods (no wrapper) or _lane_recorder."""
        self._extend = self._lanes[0].extend
        rec = self._recorder
        (self.record_received, self.record_committed, self.record_routed, self.record_delivered,
         self.record_acked) = [_lane_recorder(lane.extend) for lane in self._lanes[1:]] if rec is None else (
            rec.received, rec.committed, rec.routed, rec.delivered, rec.acked)

    def _stop_queueing(self) -> None:
        """Point every emitter at _discard (after close() or a writer failure)."""
        self._extend = self.record_received = self.record_committed = self._discard
        self.record_routed = self.record_delivered = self.record_acked = self._discard

    @staticmethod
    def _checked(kind: str, method: Callable[..., None]) -> Callable[..., None]:
        """A positional method that first checks its values against the schema (for tests)."""
        names = ("publisher_packet_id",) if kind == "received" else LAYOUTS[kind][1:]

        def checked(message: Any, *values: Any) -> None:
            if not hasattr(message, "msg_id"):
                raise ValueError(f"{kind}: expects a broker Message, got {type(message).__name__}")
            for name, value in zip(names, values, strict=True):
                problem = field_problem(name, value)
                if problem:
                    raise ValueError(f"{kind}: {problem}")
            method(message, *values)

        return checked

    @staticmethod
    def _checked_record(kind: str, record: Callable[..., None]) -> Callable[..., None]:
        """A record_<kind> callable that first checks its values against the schema (for tests)."""
        names = LAYOUTS[kind]

        def checked(*values: Any) -> None:
            if len(values) != len(names):
                raise ValueError(f"record_{kind}: expects ({', '.join(n or 'user_properties' for n in names)}), "
                                 f"got {values!r}")
            for name, value in zip(names, values, strict=True):
                problem = field_problem(name, value) if name else _user_properties_problem(value)
                if problem:
                    raise ValueError(f"record_{kind}: {problem}")
            record(*values)

        return checked

    def _emit_strict(self, kind: str, message: Any = None, **fields: Any) -> None:
        """emit() that first checks the kind and every field against the schema (for tests)."""
        if kind not in KIND_SET:
            raise ValueError(f"unknown delivery-log event kind {kind!r}")
        if message is not None and not hasattr(message, "msg_id"):
            raise ValueError(f"{kind}: message= must be a broker Message, got {type(message).__name__}")
        for name, value in fields.items():
            if name not in EMIT_FIELDS:
                raise ValueError(f"{kind}: field {name!r} is not an emit field of schema v1")
            problem = field_problem(name, value)
            if problem:
                raise ValueError(f"{kind}: {problem}")
        DeliveryLog.emit(self, kind, message, **fields)

    # -- writer thread -----------------------------------------------------------------------------------------

    def _drain(self) -> tuple[Lanes, int, bool, bytes]:
        """Take every queued event: (lanes batch, wall-minus-monotonic offset, clock stepped, C-recorded events).

        Events carry CLOCK_MONOTONIC only (one clock read each); their wall time is mono + the offset read here.
        Linux moves the wall clock against the monotonic one only by a step (NTP slews both alike), so while the
        offset read before the previous slice equals the one read after this slice, mono + offset is the wall time
        at each event's instant. When it differs (a step, or a read disturbed by more than STEP_NS) the batch is
        marked `stepped`: its records say clock_synced=false.

        Two C calls per lane, a copy of the front and its deletion: an emitter extends a lane by a whole event
        atomically under the GIL and only at the end, so each front ends on an event boundary and nothing is lost
        or taken twice. The C recorder's take() is one call too, and a record is whole in it or absent.
        Beyond `max_backlog` events the oldest are dropped and recorded.
        """
        before = _clock_offset()
        lanes: Lanes = []
        for lane in self._lanes:
            n = len(lane)
            lanes.append(lane[:n])
            del lane[:n]
        rec = self._recorder
        recorded = b""
        refused = 0
        if rec is not None:
            over = len(rec) + sum(lane_counts(lanes)) > self._max_backlog
            recorded, refused = rec.take(), rec.lost()
            if over:  # rare (the writer stalled): decoded here, so the cut below sees every event
                lanes, recorded = with_recorded(lanes, recorded), b""
        offset = _clock_offset()
        stepped = abs(offset - self._offset_before) > STEP_NS
        self._offset_before = before
        lanes, lost = keep_newest(lanes, self._max_backlog)
        if lost + refused:
            self._writer.record_loss("backlog", lost + refused)
        return lanes, offset, stepped, recorded

    def _run(self) -> None:
        """Write batches until closed; on a writer failure keep the error for flush/close and stop queueing."""
        writer = self._writer
        try:
            while True:
                self._wake.wait(self._interval)
                self._wake.clear()
                with self._done:
                    target = self._requested
                    closing = self._closing
                    rotate, self._rotate_wanted = self._rotate_wanted, False
                writer.write_lanes(*self._drain())
                writer.tick()
                if rotate:
                    writer.rotate()
                if closing:
                    writer.write_lanes(*self._drain())
                    writer.close()
                elif target > self._completed:
                    writer.sync()
                with self._done:
                    self._completed = target
                    self._done.notify_all()
                if closing:
                    return
        except BaseException as exc:  # the error is re-raised to whoever flushes or closes next
            self._stop_queueing()
            for lane in self._lanes:
                lane.clear()
            if self._recorder is not None:
                self._recorder.clear()
            with self._done:
                self._error = exc
                self._completed = 1 << 62
                self._done.notify_all()

    def _discard(self, *values: Any) -> None:
        """emit() after close() or a writer failure: count, do not queue (memory stays bounded)."""
        self.discarded += 1

    def _request(self, timeout: float | None) -> None:
        """Ask the writer thread for one pass and wait until it has done it."""
        with self._done:
            self._requested += 1
            target = self._requested
        self._wake.set()
        with self._done:
            if not self._done.wait_for(lambda: self._completed >= target, timeout):
                raise TimeoutError("delivery-log writer did not finish in time")
            if self._error is not None:
                raise DeliveryLogError(f"delivery-log writer failed: {self._error!r}") from self._error

    def flush(self, timeout: float | None = 30.0) -> None:
        """Block until every event emitted before this call is written to the OS (readable after a SIGKILL)."""
        self._request(timeout)

    def rotate(self, timeout: float | None = 30.0) -> None:
        """Write everything emitted so far and close the open segment now, so it can be uploaded."""
        with self._done:
            self._rotate_wanted = True
        self._request(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        """Write everything emitted so far, close the open segment, stop the writer thread."""
        if not self._thread.is_alive():
            if self._error is not None:
                raise DeliveryLogError(f"delivery-log writer failed: {self._error!r}") from self._error
            return
        with self._done:
            self._closing = True
        self._request(timeout)
        self._thread.join(timeout)
        self._stop_queueing()  # late emits (a racing callback) are counted, never queued forever

    def stats(self) -> WriterStats:
        """The writer's counters (events, bytes, segments, evictions, losses, recovered parts)."""
        return self._writer.stats

    @property
    def backlog(self) -> int:
        """Events emitted but not yet handed to the writer."""
        recorded = len(self._recorder) if self._recorder is not None else 0
        return recorded + sum(lane_counts([list(lane) for lane in self._lanes]))

    def __enter__(self) -> DeliveryLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
