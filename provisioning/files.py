"""File helpers for provisioning output: private (0600) writes, durable writes and content hashes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to a new file created with `mode` (never wider than asked, whatever the umask), then fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """Write a secret: a new file, mode 0600 from its creation on."""
    write_file(path, data, 0o600)


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's content."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a directory so renames and creations in it are durable (best effort on filesystems that refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
