"""Fixtures for the SD-card image tests: one image build per session (cached rootfs reused) and its pieces."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "image" / "build.sh"
# The tests build into their own directory so a developer's image/out stays untouched; the stage cache is shared.
OUT = REPO / "image" / "out" / "pytest"
TOOLS = ("mmdebstrap", "qemu-aarch64-static", "qemu-system-aarch64", "sfdisk", "mcopy", "mkfs.vfat", "fsck.vfat",
         "mkfs.ext4", "e2fsck", "debugfs", "xz", "unshare", "aarch64-linux-gnu-gcc")
# The stage cache lives on the machine, outside any clone, so a CI run in a fresh clone reuses the rootfs and
# wheelhouse that earlier builds with the same input hashes produced (a changed input still rebuilds its stage).
CACHE = Path(os.environ.get("IMAGE_TEST_CACHE", "/var/cache/appliance-image"))
# A cold build (mmdebstrap, then the base stage, under qemu-user) takes ~15 minutes on 2 idle cores (an hour on busy
# ones); a cached one (appliance code changed) well under a minute.
BUILD_TIMEOUT = 45 * 60
SECTOR = 512


@dataclass
class Image:
    """A built image and the files the build wrote next to it."""

    out: Path
    img: Path
    info: dict
    rebuild: tuple[Path, int] | None = None  # (out dir, exit status) of the second build from the same inputs

    def partitions(self) -> list[dict]:
        """The MBR partition entries as sfdisk --json reports them."""
        table = json.loads(run(["sfdisk", "--json", str(self.img)]).stdout)["partitiontable"]
        return table["partitions"]

    def extract_partition(self, number: int, dest: Path) -> Path:
        """Copy partition `number` (1-based) out of the image into `dest` (sparse)."""
        part = self.partitions()[number - 1]
        run(["dd", f"if={self.img}", f"of={dest}", f"bs={SECTOR}", f"skip={part['start']}", f"count={part['size']}",
             "conv=sparse", "status=none", "iflag=fullblock"])
        return dest


def run(args: list[str], *, timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    """Run a command with text output; fail the test with its stderr when it fails."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        command = " ".join(map(str, args))
        pytest.fail(f"{command} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("the image build needs root (mmdebstrap, chroot, file ownership)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools {missing}: run scripts/setup.sh")


@pytest.fixture(scope="session")
def built_image() -> Iterator[Image]:
    """Build the image once per session with image/build.sh (reusing the machine's stage cache) and return it."""
    _require_tools()
    prebuilt = os.environ.get("IMAGE_TEST_PREBUILT")  # developer shortcut: inspect/boot an existing build's out dir
    if prebuilt:
        out = Path(prebuilt)
        info = json.loads((out / "build-info.json").read_text())
        yield Image(out=out, img=out / info["image"], info=info)
        return
    # One test session at a time owns OUT: a second one (another checkout user) waits instead of rebuilding the image
    # under the first one's tests.
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with (OUT.parent / "pytest.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield _build_session_image()


def _build_session_image() -> Image:
    """The session's image in OUT and, right after it, the reproducibility rebuild in OUT/again."""
    env = dict(os.environ)
    if "IMAGE_TEST_XZ_LEVEL" in os.environ:
        env["XZ_LEVEL"] = os.environ["IMAGE_TEST_XZ_LEVEL"]
    OUT.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    log = OUT / "build.log"  # progress lines while it runs: tail -f image/out/pytest/build.log
    if build(OUT, log, env) != 0:
        pytest.fail(f"image/build.sh exited non-zero:\n{log.read_text()[-6000:]}")
    info = json.loads((OUT / "build-info.json").read_text())
    # The reproducibility check's second build runs right away (cached: seconds), so the checkout has little time
    # to change in between (a shared working tree); test_image_build compares the two.
    again = OUT / "again"
    env["SOURCE_DATE_EPOCH"] = str(info["source_date_epoch"])
    status = build(again, OUT / "build-again.log", env, "--no-compress")
    return Image(out=OUT, img=OUT / info["image"], info=info, rebuild=(again, status))


def build(out: Path, log: Path, env: dict[str, str], *args: str) -> int:
    """image/build.sh into OUT with the session's stage cache, output to LOG; its exit status."""
    with log.open("w") as f:
        return subprocess.run([str(BUILD), "--out", str(out), "--cache", str(CACHE), *args], cwd=REPO, env=env,
                              stdout=f, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT, check=False).returncode


@pytest.fixture(scope="session")
def root_tree(built_image: Image, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root filesystem of the image, read back out of the ext4 partition with debugfs (nothing mounted)."""
    work = tmp_path_factory.mktemp("rootfs")
    part = built_image.extract_partition(2, work / "root.ext4")
    tree = work / "tree"
    tree.mkdir()
    run(["debugfs", "-R", f"rdump / {tree}", str(part)], timeout=900)
    part.unlink()
    return tree
