"""pytest fixtures for the namespace lab; import them into a conftest (`from tests.harness.fixtures import *`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from .netns import Lab, netns_unavailable

__all__ = ["netns_lab"]


@pytest.fixture
def netns_lab() -> Iterator[Callable[..., Lab]]:
    """Factory: `lab = netns_lab(3)` builds a 3-node lab; every lab built is torn down after the test, always."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    labs: list[Lab] = []

    def make(n: int, **kw: object) -> Lab:
        lab = Lab(n, **kw)  # type: ignore[arg-type]
        labs.append(lab)
        lab.up()
        return lab

    try:
        yield make
    finally:
        for lab in labs:
            lab.down()
