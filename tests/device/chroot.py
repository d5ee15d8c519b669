"""Helpers for tests that need a Debian bookworm tree: build it once with mmdebstrap (cached), run in it, install."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "appliance-tests"


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (read at run time, never written down)."""
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if not path.is_file() or "disabled" in path.name:
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and "security" not in line:
                return next(w for w in words[1:] if "://" in w)
    pytest.skip("no Debian mirror configured for apt")


def bookworm_tree(dest: Path, packages: str) -> None:
    """Unpack a bookworm tree with `packages` (comma-separated) into `dest`, built once and cached as a tarball."""
    key = hashlib.sha256(f"bookworm {packages} v1".encode()).hexdigest()[:16]
    tarball = CACHE / f"bookworm-{key}.tar"
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        part = tarball.with_suffix(".part.tar")
        subprocess.run(["mmdebstrap", "--quiet", "--variant=apt", f"--include={packages}", "bookworm", str(part),
                        debian_mirror()], check=True, timeout=1800)
        part.rename(tarball)
    dest.mkdir()
    subprocess.run(["tar", "-xpf", str(tarball), "-C", str(dest), "--numeric-owner"], check=True)


def in_chroot(root: Path, *cmd: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run CMD chrooted in ROOT with /proc and a tmpfs /run, in a private mount namespace (nothing leaks out)."""
    spec = [f"--userspec={user}"] if user else []
    script = 'mount -t proc proc "$0/proc" && mount -t tmpfs tmpfs "$0/run" && exec chroot "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(root), *spec,
                           str(root), "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
                           "HOME=/root", *cmd], capture_output=True, text=True, timeout=900, check=False)


def install_appliance(root: Path) -> list[str]:
    """Stage our wheel + an offline wheelhouse in ROOT/tmp/ia, exactly as the image build does; return the command."""
    stage = root / "tmp" / "ia"
    wheels = stage / "wheels"
    wheels.mkdir(parents=True)
    subprocess.run([str(ROOT / ".venv/bin/pip"), "wheel", "--quiet", "-w", str(wheels), f"{ROOT}[device]"],
                   check=True, timeout=900, capture_output=True)
    wheel = next(wheels.glob("appliance-*.whl"))
    wheel.rename(stage / wheel.name)
    shutil.copytree(ROOT / "scripts", stage / "scripts")
    shutil.copytree(ROOT / "systemd", stage / "systemd")
    return ["/bin/sh", "/tmp/ia/scripts/install-appliance.sh", "--wheel", f"/tmp/ia/{wheel.name}",
            "--wheelhouse", "/tmp/ia/wheels"]
