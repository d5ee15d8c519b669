"""The store's one error type: a message the CLI prints before exiting non-zero."""

from __future__ import annotations


class StoreError(Exception):
    """The durable store cannot be opened, is corrupt, or can no longer write (disk full, I/O error)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} ({self.path})" if self.path else base
