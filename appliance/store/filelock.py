"""One store per file across processes: a POSIX lock on DB-FILE.lock, held from open() to close()."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .errors import StoreError


class StoreLock:
    """An exclusive, non-blocking lock; the kernel drops it when the process dies (kill -9 included)."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise StoreError naming the process that holds it."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise StoreError(f"the store is in use by another process (pid {holder})", path=str(self.path)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays; its content is only a hint)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
