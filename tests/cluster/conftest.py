"""Cluster test fixtures: every async test runs with a watchdog that fails it if a callback blocks the loop."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator

import pytest

from tests.harness.fixtures import netns_lab  # noqa: F401  (the shared namespace-lab fixture)

LOOP_BLOCK_LIMIT = 1.0  # seconds one callback may hold the event loop (wall time: generous for a loaded CI machine)


class _SlowCallbacks(logging.Handler):
    """Collects asyncio's debug-mode 'Executing <...> took N seconds' warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and "took" in message:
            self.records.append(message)


@pytest.fixture
async def loop_watchdog() -> AsyncIterator[None]:
    """asyncio debug mode with a LOOP_BLOCK_LIMIT slow-callback limit; fail the test if a callback exceeded it."""
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = LOOP_BLOCK_LIMIT
    handler = _SlowCallbacks()
    log = logging.getLogger("asyncio")
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)
        loop.set_debug(False)
    if handler.records:
        pytest.fail("event loop blocked: " + "; ".join(handler.records[:3]))


@pytest.fixture(autouse=True)
def _watch_async_tests(request: pytest.FixtureRequest) -> None:
    """Apply loop_watchdog to every coroutine test in this folder."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("loop_watchdog")
