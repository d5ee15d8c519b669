"""WAL checkpoints on their own thread and connection, so a commit never waits for the database file's fsync."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from .schema import connect

WAL_FRAMES_HIGH = 16_384  # ~64 MiB of 4 KiB frames: past this the writer forces a RESTART checkpoint itself


class Checkpointer:
    """Runs PRAGMA wal_checkpoint(PASSIVE) when poked by the writer or every `interval` seconds."""

    def __init__(self, path: Path, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self.checkpoints = 0
        self.errors = 0
        self.last_error = ""
        self.wal_frames = 0  # frames in the WAL at the last checkpoint
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Open a connection and start the thread."""
        conn = connect(self.path)
        self._thread = threading.Thread(target=self._run, args=(conn,), name="store-checkpoint", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Ask for a checkpoint soon (called by the writer every so many commits)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread and close its connection."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def backlog_high(self) -> bool:
        """The WAL keeps growing faster than passive checkpoints drain it."""
        return self.wal_frames > WAL_FRAMES_HIGH

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._stop:
                    return
                try:
                    _busy, frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # e.g. disk full growing the file: the WAL still holds the data
                    self.errors += 1
                    self.last_error = str(exc)
                    continue
                self.checkpoints += 1
                self.wal_frames = max(frames, 0)
        finally:
            conn.close()
