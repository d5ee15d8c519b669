"""Fixtures for device-integration tests: a real sd_notify datagram socket the test binds."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Datagram:
    """One sd_notify message as received: arrival time, sender pid (SCM_CREDENTIALS) and its KEY=value lines."""

    at: float
    pid: int
    lines: list[str]


@dataclass
class NotifySocket:
    """A bound AF_UNIX datagram socket collecting everything sent to it, like systemd's notify socket."""

    address: str  # what goes into NOTIFY_SOCKET ('@name' for the abstract namespace)
    sock: socket.socket
    received: list[Datagram] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        """Receive until stopped (runs in a thread)."""
        self.sock.settimeout(0.05)
        space = socket.CMSG_SPACE(struct.calcsize("3i"))
        while not self._stop.is_set():
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(65536, space)
            except TimeoutError:
                continue
            except OSError:
                return
            pid = -1
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", payload[: struct.calcsize("3i")])[0]
            with self._cond:
                self.received.append(Datagram(time.monotonic(), pid, data.decode().split("\n")))
                self._cond.notify_all()

    def wait_for(self, line: str, timeout: float = 30.0) -> Datagram:
        """Block until a datagram containing `line` has arrived; fail the test otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for dgram in self.received:
                    if line in dgram.lines:
                        return dgram
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"{line!r} never arrived; got {[d.lines for d in self.received]}")
                self._cond.wait(left)

    def lines(self) -> list[tuple[float, str]]:
        """Every received line with its arrival time, in order."""
        with self._cond:
            return [(d.at, line) for d in self.received for line in d.lines]


def _bind(address: str, tmp_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
    return sock


@pytest.fixture(params=["path", "abstract"])
def notify_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NotifySocket]:
    """A notify socket at a filesystem path or in the abstract namespace ('@...')."""
    if request.param == "path":
        address = str(tmp_path / "notify.sock")
    else:
        address = f"@appliance-test-{os.getpid()}-{time.monotonic_ns()}"
    ns = NotifySocket(address, _bind(address, tmp_path))
    thread = threading.Thread(target=ns.run, daemon=True)
    thread.start()
    yield ns
    ns._stop.set()
    thread.join(5)
    ns.sock.close()
