"""Fixtures for the store tests: a store file in tmp_path, closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.store import SqliteStore


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    """Path of a fresh store file."""
    return tmp_path / "store.sqlite3"


@pytest.fixture
def make_store(db_file: Path) -> Iterator[Callable[..., SqliteStore]]:
    """Factory for opened (not started) stores on db_file; every store it made is closed at teardown."""
    made: list[SqliteStore] = []

    def factory(path: Path | None = None, **kw: Any) -> SqliteStore:
        store = SqliteStore(path or db_file, **kw)
        store.open()
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()
