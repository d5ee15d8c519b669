"""Start a real broker process (ours or Debian's mosquitto) on a free loopback port, and stop it afterwards."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
APPLIANCE = REPO / ".venv" / "bin" / "appliance"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
KINDS = ("ours", "mosquitto")
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
TRACEBACK_MARK = "Traceback (most recent call last)"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def ours_unavailable() -> str | None:
    """Return why `appliance run` cannot be used yet, or None when `appliance run --help` works."""
    if not APPLIANCE.exists():
        return f"{APPLIANCE} is not installed"
    try:
        res = subprocess.run([str(APPLIANCE), "run", "--help"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "`appliance run --help` did not finish within 30 s"
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"`appliance run --help` exits {res.returncode}: {tail[0]}"
    return None


def mosquitto_config(port: int, data_dir: Path, extra: str = "") -> Path:
    """Write a mosquitto.conf listening on 127.0.0.1:port with persistence under data_dir; return its path."""
    conf = data_dir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "user root\n"
        "persistence true\n"
        f"persistence_location {data_dir}/\n"
        "log_dest stderr\n"
        "log_type error\nlog_type warning\nlog_type notice\n"
        f"{extra}"
    )
    return conf


@dataclass
class BrokerProcess:
    """One running broker: where to connect, its data dir and log, and how to stop, kill or restart it."""

    kind: str
    host: str
    port: int
    data_dir: Path
    log_path: Path
    extra_args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    stopped_on_purpose: bool = False
    logs: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The broker's process id."""
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        """The argv that starts this broker."""
        if self.kind == "ours":
            return [str(APPLIANCE), "run", "--listen", f"{self.host}:{self.port}", "--data-dir", str(self.data_dir),
                    *self.extra_args]
        if self.kind == "mosquitto":
            conf = mosquitto_config(self.port, self.data_dir, "\n".join(self.extra_args) + "\n")
            return [MOSQUITTO, "-c", str(conf)]
        raise ValueError(f"unknown broker kind {self.kind!r}")

    def start(self) -> None:
        """Start the process and wait until its port accepts a TCP connection."""
        self.stopped_on_purpose = False
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir,
                                         start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited {self.proc.returncode} at start:\n{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=0.5):
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.kind} did not accept on {self.host}:{self.port} in {START_TIMEOUT} s:\n"
                           f"{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Send sig, wait up to STOP_TIMEOUT, SIGKILL if still running; return the exit code."""
        self.stopped_on_purpose = True
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        return self.proc.returncode

    def kill(self) -> int | None:
        """SIGKILL the broker (a crash) and reap it."""
        return self.stop(signal.SIGKILL)

    def restart(self) -> None:
        """Stop gracefully, then start again on the same port and data dir."""
        self.stop()
        self.start()

    def log_text(self) -> str:
        """Everything the broker wrote to stdout/stderr so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the broker's log."""
        return "\n".join(self.log_text().splitlines()[-lines:])

    def problems(self) -> list[str]:
        """What should fail the test: an unexpected exit, or a traceback in our broker's log."""
        found = []
        if self.proc is not None and self.proc.poll() is not None and not self.stopped_on_purpose:
            found.append(f"{self.kind} exited on its own with code {self.proc.returncode}")
        if self.kind == "ours" and TRACEBACK_MARK in self.log_text():
            found.append("our broker logged a traceback")
        return found


@contextlib.contextmanager
def running_broker(kind: str, data_dir: Path, extra_args: tuple[str, ...] = ()) -> Iterator[BrokerProcess]:
    """Run one broker for the duration of the block; raise AssertionError on an unexpected exit or traceback."""
    data_dir.mkdir(parents=True, exist_ok=True)
    last_error: Exception | None = None
    for _ in range(3):  # a port taken between free_port() and bind() is retried on another port
        broker = BrokerProcess(kind, "127.0.0.1", free_port(), data_dir, data_dir / f"{kind}.log", extra_args)
        try:
            broker.start()
            break
        except RuntimeError as exc:
            last_error = exc
            if "in use" not in str(exc).lower():
                raise
    else:
        raise RuntimeError(f"could not start {kind}") from last_error
    try:
        yield broker
    finally:
        problems = broker.problems()
        broker.stop()
        problems += [p for p in broker.problems() if "traceback" in p and p not in problems]
        if problems:
            raise AssertionError("; ".join(problems) + f"\n--- {kind} log tail ---\n{broker.log_tail()}")


def broker_fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """Body of the `broker` fixture: request.param is "ours" or "mosquitto" (default "mosquitto")."""
    kind = getattr(request, "param", "mosquitto")
    if kind == "ours":
        reason = ours_unavailable()
        if reason:
            pytest.skip(f"our broker is not runnable yet ({reason})")
    elif kind == "mosquitto" and not os.access(MOSQUITTO, os.X_OK):
        pytest.fail(f"mosquitto not found at {MOSQUITTO}: run scripts/setup.sh")
    data_dir = tmp_path_factory.mktemp(f"broker-{kind}")
    try:
        with running_broker(kind, data_dir) as broker:
            yield broker
    except AssertionError as exc:
        pytest.fail(str(exc), pytrace=False)
