"""Pytest fixtures over tests.support: import them into a conftest.py (`from tests.support.fixtures import ...`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.broker import KINDS, BrokerProcess, broker_fixture
from tests.support.micropython import MicroPython, MicroPythonSetupError, ensure_micropython


@pytest.fixture(params=KINDS)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A running broker process per test, parametrized over "ours" and "mosquitto" (override with indirect=True)."""
    yield from broker_fixture(request, tmp_path_factory)


@pytest.fixture(scope="session")
def micropython() -> MicroPython:
    """The cached MicroPython chroot with umqtt.simple and umqtt.robust installed."""
    try:
        return ensure_micropython()
    except MicroPythonSetupError as exc:
        pytest.fail(f"MicroPython chroot unavailable: {exc}", pytrace=False)
