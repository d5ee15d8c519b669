"""The real broker under a test-bound NOTIFY_SOCKET: READY only once the port accepts; watchdog; STOPPING; failures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPLIANCE = ROOT / ".venv" / "bin" / "appliance"
CONNECT = bytes.fromhex("100c00044d5154540402003c0000")  # MQTT 3.1.1 CONNECT, clean session, empty client id
pytestmark = pytest.mark.skipif(not APPLIANCE.exists(), reason="needs the appliance console script in .venv")


class Notify:
    """A bound notify socket read only when the test says so, so its queue can be kept full on purpose."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.fillers = 0

    def fill(self) -> None:
        """Fill the receive queue (net.unix.max_dgram_qlen) so the next sender blocks in sendmsg."""
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.setblocking(False)
        try:
            while True:
                sender.sendto(b"X_FILLER=1", self.path)
                self.fillers += 1
        except BlockingIOError:
            pass
        finally:
            sender.close()
        assert self.fillers > 0

    def drain(self, timeout: float) -> list[str]:
        """Every line received within `timeout` seconds, fillers dropped."""
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            lines += [line for line in data.decode().split("\n") if line != "X_FILLER=1"]
        return lines

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[Notify]:
    n = Notify(tmp_path / "notify.sock")
    yield n
    n.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(tmp_path: Path, notify: Notify, port: int, watchdog_usec: int = 1_000_000,
          data_dir: Path | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_PID", "INVOCATION_ID", "JOURNAL_STREAM")}
    env |= {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(watchdog_usec)}
    return subprocess.Popen([str(APPLIANCE), "run", "--listen", f"127.0.0.1:{port}",
                             "--data-dir", str(data_dir or tmp_path / "data"), "--node-name", "notify-test",
                             "--metrics", "", "--log-level", "WARNING"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_blocked_on_notify(proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Wait until the broker's main thread sleeps in sendmsg to our full notify socket."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"broker exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
        with open(f"/proc/{proc.pid}/wchan") as f:
            if f.read().strip() == "unix_wait_for_peer":
                return
        time.sleep(0.01)
    pytest.fail("the broker never tried to notify")


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def test_ready_only_once_port_accepts_then_watchdog_and_stopping(tmp_path: Path, notify: Notify) -> None:
    port = free_port()
    notify.fill()
    proc = start(tmp_path, notify, port)
    try:
        # The broker is frozen inside its first sd_notify call (our queue is full). Whatever it is sending, the
        # listener must already accept, because that first message is READY=1.
        wait_blocked_on_notify(proc)
        assert accepts(port), "READY is being sent while the port does not accept"
        lines = notify.drain(1.0)
        assert lines and lines[0] == "READY=1", lines
        assert any(line.startswith("STATUS=") for line in lines)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:  # and it serves MQTT
            client.sendall(CONNECT)
            assert client.recv(4) == bytes.fromhex("20020000")
        # Watchdog: WATCHDOG_USEC=1 s -> a ping every 0.5 s from the event loop.
        lines += notify.drain(2.5)
        assert lines.count("WATCHDOG=1") >= 3, lines
        # A frozen process sends nothing (systemd would kill it after WatchdogSec); thawed, the pings resume.
        proc.send_signal(signal.SIGSTOP)
        try:
            notify.drain(0.3)  # a ping sent just before the stop took effect may still be queued
            frozen = notify.drain(2.0)
        finally:
            proc.send_signal(signal.SIGCONT)
        assert "WATCHDOG=1" not in frozen, frozen
        assert "WATCHDOG=1" in notify.drain(2.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "STOPPING=1" in notify.drain(1.0)
    finally:
        stop(proc)


def test_no_ready_when_the_port_is_taken(tmp_path: Path, notify: Notify) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        proc = start(tmp_path, notify, port)
        code = proc.wait(60)
    assert code != 0
    assert "READY=1" not in notify.drain(0.5)


def test_no_ready_when_the_store_cannot_open(tmp_path: Path, notify: Notify) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "broker.db").write_bytes(b"this is not an SQLite database" * 100)
    proc = start(tmp_path, notify, free_port(), data_dir=data)
    code = proc.wait(60)
    assert code != 0
    assert "READY=1" not in notify.drain(0.5)


def test_the_ordering_check_catches_ready_before_listen(tmp_path: Path, notify: Notify) -> None:
    """Control: a program that says READY=1 before it listens is caught by the same check."""
    port = free_port()
    premature = ("import socket, sys\n"
                 "from appliance.server.systemd import Notifier\n"
                 "Notifier.from_env().ready('too early')\n"
                 "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n")
    notify.fill()
    env = dict(os.environ, NOTIFY_SOCKET=notify.path, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-c", premature, str(port)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_blocked_on_notify(proc)
        assert not accepts(port)
        assert notify.drain(1.0)[0] == "READY=1"
    finally:
        stop(proc)
