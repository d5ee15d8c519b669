"""Session-wide hooks: when the SD-card image tests are selected, warm the image stage cache from the start.

A cold image build (mmdebstrap under qemu-user) takes tens of minutes; started when collection ends it overlaps the
rest of the suite on the second core. image/build.sh holds the cache's lock, so the image fixture's own build waits
for the warm-up and then finds every stage cached.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WARM_OUT = REPO / "image" / "out" / "pytest-warm"
_warmup: subprocess.Popen[bytes] | None = None


def _image_cache() -> Path:
    return Path(os.environ.get("IMAGE_TEST_CACHE", "/var/cache/appliance-image"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the image stage-cache warm-up in the background if an image test will run."""
    global _warmup
    if session.config.option.collectonly or os.environ.get("IMAGE_TEST_PREBUILT") or os.geteuid() != 0:
        return
    if not any(item.get_closest_marker("image") for item in session.items):
        return
    if shutil.which("mmdebstrap") is None:
        return  # the image tests report the missing tools themselves
    cache = _image_cache()
    cache.mkdir(parents=True, exist_ok=True)
    WARM_OUT.mkdir(parents=True, exist_ok=True)
    with (WARM_OUT / "build.log").open("wb") as log:
        _warmup = subprocess.Popen([str(REPO / "image" / "build.sh"), "--out", str(WARM_OUT), "--cache", str(cache),
                                    "--no-compress"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Never leave the warm-up running after the suite (an interrupted run, or image tests deselected late)."""
    if _warmup is None:
        return
    if _warmup.poll() is None:
        os.killpg(_warmup.pid, signal.SIGTERM)  # build.sh and its mmdebstrap / qemu children
        try:
            _warmup.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(_warmup.pid, signal.SIGKILL)
            _warmup.wait()
    shutil.rmtree(WARM_OUT, ignore_errors=True)  # only the stage cache was wanted
