"""Durable SQLite store adapter: implements appliance.broker.ports.Store with group commit."""

from .errors import StoreError
from .schema import DB_FILE_NAME, db_path
from .sqlite import SqliteStore

__all__ = ["DB_FILE_NAME", "SqliteStore", "StoreError", "db_path"]
