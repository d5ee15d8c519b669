"""Pytest fixtures over tests.support: import them into a conftest.py (`from tests.support.fixtures import ...`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import pytest

from tests.support.broker import KINDS, BrokerProcess, broker_fixture, ours_unavailable, running_broker
from tests.support.micropython import MicroPython, MicroPythonSetupError, ensure_micropython

BrokerFactory = Callable[..., BrokerProcess]


@pytest.fixture(params=KINDS)
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A running broker process per test, parametrized over "ours" and "mosquitto" (override with indirect=True)."""
    yield from broker_fixture(request, tmp_path_factory)


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """start(kind="mosquitto", extra=()) -> a running BrokerProcess; every one is checked and stopped at teardown.

    extra is appended to `appliance run` arguments for "ours", and added as config lines for "mosquitto".
    """
    stack = contextlib.ExitStack()

    def start(kind: str = "mosquitto", extra: Iterable[str] = ()) -> BrokerProcess:
        if kind == "ours" and (reason := ours_unavailable()):
            pytest.skip(f"our broker is not runnable yet ({reason})")
        data_dir = tmp_path_factory.mktemp(f"broker-{kind}")
        return stack.enter_context(running_broker(kind, data_dir, tuple(extra)))

    try:
        yield start
    finally:
        try:
            stack.close()
        except AssertionError as exc:
            pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def micropython() -> MicroPython:
    """The cached MicroPython chroot with umqtt.simple and umqtt.robust installed."""
    try:
        return ensure_micropython()
    except MicroPythonSetupError as exc:
        pytest.fail(f"MicroPython chroot unavailable: {exc}", pytrace=False)
