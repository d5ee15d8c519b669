"""One real broker process (ours) per conformance module; tests isolate themselves by client id and topic."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess, running_broker
from tests.support.raw import RawClient

_ids = itertools.count()


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Our broker as a real process with default settings."""
    with running_broker("ours", tmp_path_factory.mktemp("ours")) as broker:
        yield broker


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> str:
    """A name unique to this test (client ids and topic prefixes)."""
    return f"{request.node.name.replace('[', '-').replace(']', '')}-{next(_ids)}"


@pytest.fixture
def client(ours: BrokerProcess) -> Iterator[Callable[..., RawClient]]:
    """Factory of raw clients connected to `ours`, all closed after the test."""
    made: list[RawClient] = []

    def make(version: int = 4, **kw: object) -> RawClient:
        c = RawClient(ours.port, version, **kw)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def broker_with(tmp: Path, toml: str) -> object:
    """Context manager: our broker started with an extra TOML config."""
    conf = tmp / "appliance.toml"
    conf.write_text(toml)
    return running_broker("ours", tmp, ("--config", str(conf)))
