"""A Debian trixie chroot with real MicroPython and umqtt.simple/robust, built once and cached under tests/.cache/."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "tests" / ".cache"
SUITE = "trixie"
UMQTT = {
    "micropython-umqtt.simple": ("1.3.4", "umqtt/simple.py"),
    "micropython-umqtt.robust": ("1.0", "umqtt/robust.py"),
}
RECIPE = f"v1 {SUITE} essential+micropython " + " ".join(f"{k}=={v[0]}" for k, v in UMQTT.items())
BUILD_TIMEOUT = 900
_LINK = re.compile(r"(https?://\S+?\.tar\.gz)(?:#sha256=([0-9a-f]{64}))?")


class MicroPythonSetupError(RuntimeError):
    """The chroot or the umqtt sources could not be prepared."""


def debian_mirror() -> str:
    """The host's Debian archive URL, read from /etc/apt/sources.list* (never written down anywhere)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        if not f.is_file() or f.suffix not in ("", ".list", ".sources"):
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                disabled = re.search(r"^Enabled:\s*no", stanza, re.M | re.I)
                if disabled or not re.search(r"^Types:.*\bdeb\b", stanza, re.M):
                    continue
                m = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if m and "security" not in m.group(1):
                    return m.group(1)
        else:
            for line in text.splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", line)
                if m and "security" not in m.group(1):
                    return m.group(1)
    raise MicroPythonSetupError("no Debian mirror found in /etc/apt/sources.list*")


def umqtt_tarball_url(requirement: str) -> tuple[str, str | None]:
    """Ask pip for the sdist it would fetch (pip itself refuses these sdists) and parse its URL and sha256."""
    with _tempdir("pipdl") as dest:
        res = subprocess.run(
            [sys.executable, "-m", "pip", "download", requirement, "--no-binary", ":all:", "--no-deps",
             "--no-cache-dir", "-d", str(dest), "-vvv"],
            capture_output=True, text=True, timeout=180,
        )
    name = requirement.split("==")[0]
    for m in _LINK.finditer(res.stdout + res.stderr):
        url = m.group(1)
        if url.rsplit("/", 1)[-1].startswith(f"{name}-{requirement.split('==')[1]}"):
            return url, m.group(2)
    raise MicroPythonSetupError(f"pip named no tarball for {requirement}; its output ends:\n{res.stderr[-2000:]}")


def fetch_umqtt(dest_lib: Path) -> None:
    """Copy umqtt/simple.py and umqtt/robust.py from their PyPI sdists into dest_lib/umqtt/."""
    target = dest_lib / "umqtt"
    target.mkdir(parents=True, exist_ok=True)
    (target / "__init__.py").write_text("")
    for name, (version, member) in UMQTT.items():
        url, sha = umqtt_tarball_url(f"{name}=={version}")
        with urllib.request.urlopen(url, timeout=60) as resp:  # the URL is the one pip's index lookup named
            data = resp.read()
        if sha and hashlib.sha256(data).hexdigest() != sha:
            raise MicroPythonSetupError(f"sha256 mismatch for {url}")
        with _tempdir("sdist") as tmp:
            archive = tmp / "sdist.tar.gz"
            archive.write_bytes(data)
            with tarfile.open(archive) as tar:
                found = [m for m in tar.getmembers() if m.isfile() and m.name.endswith("/" + member)]
                if not found:
                    raise MicroPythonSetupError(f"{member} not in {url}")
                src = tar.extractfile(found[0])
                assert src is not None
                (target / Path(member).name).write_bytes(src.read())


@dataclass(frozen=True)
class MicroPython:
    """A ready chroot; run() executes a MicroPython script inside it (host network namespace, so 127.0.0.1 works)."""

    root: Path

    def popen(self, script: str, name: str = "script.py") -> subprocess.Popen[str]:
        """Start `chroot ROOT micropython /tmp/NAME` with script as its source; stdout/stderr piped."""
        (self.root / "tmp" / name).write_text(script)
        return subprocess.Popen(["chroot", str(self.root), "micropython", f"/tmp/{name}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, script: str, timeout: float = 30.0, name: str = "script.py") -> subprocess.CompletedProcess[str]:
        """Run script to completion (bounded by timeout) and return its output."""
        (self.root / "tmp" / name).write_text(script)
        return subprocess.run(["chroot", str(self.root), "micropython", f"/tmp/{name}"],
                              capture_output=True, text=True, timeout=timeout)


def micropython_lib_dir(root: Path) -> Path:
    """The chroot's library directory on MicroPython's sys.path (asked from micropython itself)."""
    res = subprocess.run(["chroot", str(root), "micropython", "-c", "import sys; print(' '.join(sys.path))"],
                         capture_output=True, text=True, timeout=60, check=True)
    paths = [p for p in res.stdout.split() if p.startswith("/")]
    existing = [p for p in paths if (root / p.lstrip("/")).is_dir()]
    system = [p for p in paths if p.startswith("/usr/")]  # not a per-user dir: every uid in the chroot sees it
    candidates = existing or system or paths
    if not candidates:
        raise MicroPythonSetupError(f"micropython has no absolute sys.path entry: {res.stdout!r}")
    return root / candidates[0].lstrip("/")


def build_chroot(root: Path) -> None:
    """mmdebstrap an essential trixie chroot with micropython into root, then add umqtt."""
    if shutil.which("mmdebstrap") is None:
        raise MicroPythonSetupError("mmdebstrap is not installed: run scripts/setup.sh")
    log = root.with_suffix(".log")
    with log.open("w") as out:
        res = subprocess.run(["mmdebstrap", "--variant=essential", "--include=micropython", SUITE, str(root),
                              debian_mirror()], stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
    if res.returncode != 0:
        raise MicroPythonSetupError(f"mmdebstrap failed ({res.returncode}):\n{log.read_text()[-3000:]}")
    fetch_umqtt(micropython_lib_dir(root))


def ensure_micropython() -> MicroPython:
    """Return the cached chroot, building it first (under a file lock) if missing or built from an older recipe."""
    if os.geteuid() != 0:
        raise MicroPythonSetupError("building and entering the MicroPython chroot needs root")
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / ".gitignore").write_text("*\n")
    root = CACHE / f"micropython-{SUITE}"
    stamp = CACHE / f"micropython-{SUITE}.recipe"
    with (CACHE / "micropython.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == RECIPE and (root / "usr/bin/micropython").exists()):
            stamp.unlink(missing_ok=True)
            partial = root.with_name(root.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            build_chroot(partial)
            shutil.rmtree(root, ignore_errors=True)
            partial.rename(root)
            stamp.write_text(RECIPE)
    return MicroPython(root)


@contextlib.contextmanager
def _tempdir(prefix: str) -> Iterator[Path]:
    """A temporary directory removed on exit."""
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-") as d:
        yield Path(d)
