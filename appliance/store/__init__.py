"""Durable SQLite store adapter: implements appliance.broker.ports.Store with group commit."""

from .errors import StoreError
from .sqlite import SqliteStore

__all__ = ["SqliteStore", "StoreError"]
