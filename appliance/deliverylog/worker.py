"""The segment writer in a child process: the broker only marshals batches down a pipe, no GIL shared with JSON/gzip.

Frames on the pipes are `<type byte><u32 length><payload>`. Parent -> child: S(etup JSON),
B(atch: marshal of a flat [kind, wall, mono, fields, ...] list), W (marshal of (clock offset, stepped, lanes batch)),
X (<u32 n> then W's n bytes, then the C recorder's bytes of more events for lanes 1..5),
L(oss JSON), F(lush), R(otate), C(lose).
Child -> parent: A(ck, stats JSON) or E(rror text). The child ignores SIGTERM/SIGINT and exits on EOF after closing
its segment, so a killed or stopping broker loses nothing it sent.
"""

from __future__ import annotations

import fcntl
import json
import marshal
import os
import struct
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from .batch import ITEM_LEN, Item, Lanes, items_of, lane_counts, pack, pack_lanes, with_recorded
from .identity import Identity
from .limits import DeliveryLogError, Limits, WriterStats

_HEAD = struct.Struct("!cI")
_SPLIT = struct.Struct("!I")
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux
PIPE_BYTES = 1 << 20


def send(out: Any, kind: bytes, payload: bytes = b"") -> None:
    """Write one frame."""
    out.write(_HEAD.pack(kind, len(payload)) + payload)
    out.flush()


class FrameReader:
    """Reads whole frames from a raw fd (select-friendly: no hidden buffering)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _fill(self, n: int) -> bool:
        """Read until `n` bytes are buffered; False at EOF."""
        while len(self.buf) < n:
            chunk = os.read(self.fd, max(1 << 16, n - len(self.buf)))
            if not chunk:
                return False
            self.buf += chunk
        return True

    def read(self) -> tuple[bytes, bytes] | None:
        """The next frame, or None at EOF."""
        if not self._fill(_HEAD.size):
            return None
        kind, length = _HEAD.unpack_from(self.buf)
        if not self._fill(_HEAD.size + length):
            return None
        payload = bytes(self.buf[_HEAD.size : _HEAD.size + length])
        del self.buf[: _HEAD.size + length]
        return kind, payload


def unpack(payload: bytes) -> list[Item]:
    """The events of a packed batch."""
    return items_of(marshal.loads(payload))


def pack_recorded(lanes: Lanes, offset: int, stepped: bool, recorded: bytes) -> bytes:
    """An X frame's payload: the W payload of `lanes`, then the C recorder's bytes."""
    packed = pack_lanes(lanes, offset, stepped)
    return _SPLIT.pack(len(packed)) + packed + recorded


def unpack_recorded(payload: bytes) -> tuple[Lanes, int, bool]:
    """An X frame's (lanes batch, offset, stepped), the recorded events decoded into the lanes; ValueError if bad."""
    if len(payload) < _SPLIT.size:
        raise ValueError("an X frame shorter than its header")
    (n,) = _SPLIT.unpack_from(payload)
    offset, stepped, lanes = marshal.loads(payload[_SPLIT.size : _SPLIT.size + n])
    return with_recorded(lanes, payload[_SPLIT.size + n :]), offset, stepped


class WriterProcess:
    """Parent-side handle with SegmentWriter's interface; the work runs in `python -m appliance.deliverylog.child`."""

    def __init__(
        self, directory: str, identity: Identity, limits: Limits, clock_synced: bool | None, seq_property: str
    ) -> None:
        self._setup = json.dumps(
            {"directory": directory, "identity": asdict(identity), "limits": asdict(limits),
             "clock_synced": clock_synced, "seq_property": seq_property}
        ).encode()
        self.stats = WriterStats()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._spawn()

    def _spawn(self) -> None:
        """Start the child and wait for it to open the directory (recovering parts, taking the lock)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.deliverylog.child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:  # a roomier pipe absorbs bursts while the (niced) writer waits for CPU
            fcntl.fcntl(proc.stdin.fileno(), F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass
        self.proc = proc
        self._reader = FrameReader(proc.stdout.fileno())
        send(proc.stdin, b"S", self._setup)
        self._await_ack()

    def _await_ack(self) -> None:
        """Wait for the child's ack (updating stats); raise DeliveryLogError on its error or death."""
        frame = self._reader.read()
        if frame is None:
            code = self.proc.wait() if self.proc else None
            raise DeliveryLogError(f"delivery-log writer process exited ({code})")
        kind, payload = frame
        if kind == b"E":
            raise DeliveryLogError(payload.decode(errors="replace"))
        data = json.loads(payload)
        self.stats = WriterStats(**data)

    def _call(self, kind: bytes, payload: bytes = b"", ack: bool = False) -> None:
        """Send one frame (and wait for the ack); a dead child is restarted once and the loss recorded."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            send(self.proc.stdin, kind, payload)
            if ack:
                self._await_ack()
        except (BrokenPipeError, DeliveryLogError) as exc:
            if isinstance(exc, DeliveryLogError) and "exited" not in str(exc):
                raise
            self.restarts += 1
            self._spawn()  # recovers the open segment the dead child left
            if kind == b"B":
                self.record_loss("writer_restart", len(marshal.loads(payload)) // ITEM_LEN)
            elif kind == b"W":
                self.record_loss("writer_restart", sum(lane_counts(marshal.loads(payload)[2])))
            elif kind == b"X":
                self.record_loss("writer_restart", sum(lane_counts(unpack_recorded(payload)[0])))

    def write(self, items: list[Item]) -> None:
        """Hand a batch to the child."""
        self.write_flat([entry for item in items for entry in item])

    def write_flat(self, flat: list[Any]) -> None:
        """Hand a flat batch [kind, wall, mono, fields, ...] to the child: one marshal call, one pipe write."""
        if flat:
            self._call(b"B", pack(flat))

    def write_lanes(self, lanes: Lanes, offset: int, stepped: bool, recorded: bytes = b"") -> None:
        """Hand a lanes batch (DeliveryLog's drain), its clock offset and C-recorded events to the child (one write).

        The recorded bytes go as they are: the child decodes them.
        """
        if recorded:
            self._call(b"X", pack_recorded(lanes, offset, stepped, recorded))
        elif any(lanes):
            self._call(b"W", pack_lanes(lanes, offset, stepped))

    def record_loss(self, reason: str, events: int) -> None:
        """Have the child record a log_evicted for events lost before reaching it."""
        self._call(b"L", json.dumps([reason, events]).encode())

    def tick(self) -> None:
        """The child ticks on its own."""

    def sync(self) -> None:
        """Wait until the child has written everything sent so far."""
        self._call(b"F", ack=True)

    def rotate(self) -> None:
        """Close the open segment now."""
        self._call(b"R", ack=True)

    def close(self) -> None:
        """Close the segment and let the child exit."""
        if self.proc is None:
            return
        self._call(b"C", ack=True)
        self.proc.wait(60)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self.proc = None
