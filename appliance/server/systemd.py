"""systemd integration: sd_notify (READY/STATUS/WATCHDOG/STOPPING) from the event loop, and journald logging."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import socket
import struct
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

# How the node uses this module (appliance/server wires it):
#   notifier = Notifier.from_env()
#   setup_logging("INFO")
#   ... open the store, start listeners ...
#   notifier.ready("serving 1883")          # only now: store open, sockets accept
#   notifier.async_start_watchdog()         # WATCHDOG=1 every WATCHDOG_USEC/2 from the loop itself
#   notifier.async_start_status(lambda: f"{n} clients, {q} queued")
#   ... on SIGTERM: notifier.stopping(); await notifier.async_close()

_sd_daemon: Any = None  # systemd-python, when the device extra is installed; else the stdlib code paths below
_sd_journal: Any = None
with contextlib.suppress(ImportError):
    _sd_daemon = importlib.import_module("systemd.daemon")
    _sd_journal = importlib.import_module("systemd.journal")

log = logging.getLogger(__name__)

JOURNAL_SOCKET = "/run/systemd/journal/socket"
STATUS_INTERVAL = 10.0  # seconds between STATUS= refreshes when no watchdog sets the pace


class Notifier:
    """Sends sd_notify messages to NOTIFY_SOCKET; every method is a no-op when not started by systemd."""

    def __init__(self, socket_path: str | None, watchdog_usec: int | None = None, backend: str = "auto") -> None:
        self.socket_path = socket_path or None
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        if backend not in ("auto", "systemd-python", "socket"):
            raise ValueError(f"unknown notify backend {backend!r}")
        self._use_libsystemd = backend != "socket" and _sd_daemon is not None
        if backend == "systemd-python" and _sd_daemon is None:
            raise RuntimeError("systemd-python is not importable")
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0  # datagrams successfully handed to systemd

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, backend: str = "auto") -> Notifier:
        """Build from NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (the watchdog is ours only if the pid matches)."""
        env = os.environ if environ is None else environ
        usec: int | None = None
        with contextlib.suppress(ValueError):
            usec = int(env.get("WATCHDOG_USEC", ""))
        pid = env.get("WATCHDOG_PID")
        if pid and pid != str(os.getpid()):
            usec = None
        return cls(env.get("NOTIFY_SOCKET"), usec, backend)

    @property
    def enabled(self) -> bool:
        """True when a notify socket is known."""
        return self.socket_path is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between pings: half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises; None when off."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2_000_000

    def notify(self, *assignments: str) -> bool:
        """Send one datagram of `KEY=value` lines; return whether it was delivered."""
        if self.socket_path is None or not assignments:
            return False
        payload = "\n".join(assignments)
        if "\0" in payload:
            raise ValueError("sd_notify payload may not contain NUL")
        if self._use_libsystemd and os.environ.get("NOTIFY_SOCKET") == self.socket_path:
            ok = bool(_sd_daemon.notify(payload))
        else:
            ok = self._send_datagram(payload.encode("utf-8"))
        self.sent += ok
        return ok

    def ready(self, status: str | None = None) -> bool:
        """Send READY=1; call only once the store is open and every listener accepts connections."""
        return self.notify("READY=1", *_status_line(status))

    def status(self, text: str) -> bool:
        """Send a one-line STATUS= shown by `systemctl status`."""
        return self.notify(*_status_line(text))

    def reloading(self) -> bool:
        """Send RELOADING=1 (configuration reload in progress; send ready() when done)."""
        return self.notify("RELOADING=1")

    def stopping(self, status: str | None = "shutting down") -> bool:
        """Send STOPPING=1 as shutdown begins."""
        return self.notify("STOPPING=1", *_status_line(status))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more start/stop time (EXTEND_TIMEOUT_USEC), e.g. during a long store recovery."""
        return self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def watchdog_ping(self) -> bool:
        """Send WATCHDOG=1 once."""
        return self.notify("WATCHDOG=1")

    def async_start_watchdog(self, healthy: Callable[[], bool] | None = None) -> asyncio.Task[None] | None:
        """Start pinging from the running loop every WATCHDOG_USEC/2; a blocked loop or `healthy()` False stops it."""
        interval = self.watchdog_interval
        if interval is None or not self.enabled:
            return None
        return self._spawn(self._async_watchdog(interval, healthy), "sd-watchdog")

    def async_start_status(self, provider: Callable[[], str], interval: float = STATUS_INTERVAL) -> asyncio.Task[None]:
        """Refresh STATUS= from `provider()` every `interval` seconds on the running loop."""
        return self._spawn(self._async_status(provider, interval), "sd-status")

    async def async_close(self) -> None:
        """Cancel the watchdog/status tasks and close the socket."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.close()

    def close(self) -> None:
        """Close the datagram socket (tasks, if any, must already be cancelled)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)  # keep a reference until done
        task.add_done_callback(self._tasks.discard)
        return task

    async def _async_watchdog(self, interval: float, healthy: Callable[[], bool] | None) -> None:
        while True:
            if healthy is None or healthy():
                self.watchdog_ping()
            else:
                log.warning("health check failed: withholding WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _async_status(self, provider: Callable[[], str], interval: float) -> None:
        while True:
            try:
                self.status(provider())
            except Exception:  # a broken provider must not kill the task; the error is reported, not hidden
                log.exception("status provider failed")
            await asyncio.sleep(interval)

    def _send_datagram(self, payload: bytes) -> bool:
        assert self.socket_path is not None
        address = _socket_address(self.socket_path)
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(payload, address)
            except OSError as exc:
                log.debug("sd_notify to %s failed: %s", self.socket_path, exc)
                return False
        return True


def _status_line(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    return ("STATUS=" + " ".join(text.split()),)  # STATUS is one line


def _socket_address(path: str) -> str | bytes:
    """Map '@name' to the abstract namespace (leading NUL), as sd_notify(3) does."""
    if path.startswith("@"):
        return b"\0" + path[1:].encode()
    return path


def under_journald(environ: Mapping[str, str] | None = None, stream: Any = None) -> bool:
    """True when stderr is connected to journald (JOURNAL_STREAM matches it) or systemd started us (INVOCATION_ID)."""
    env = os.environ if environ is None else environ
    journal_stream = env.get("JOURNAL_STREAM")
    if journal_stream:
        dev, _, ino = journal_stream.partition(":")
        try:
            st = os.fstat((stream or sys.stderr).fileno())
            if (str(st.st_dev), str(st.st_ino)) == (dev, ino):
                return True
        except (OSError, ValueError, AttributeError):
            pass
    return bool(env.get("INVOCATION_ID"))


_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
_PRIORITY = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def journal_priority(levelno: int) -> int:
    """Map a logging level to a syslog priority (crit 2, err 3, warning 4, info 6, debug 7)."""
    for threshold, priority in _PRIORITY:
        if levelno >= threshold:
            return priority
    return 7


def journal_fields(record: logging.LogRecord, message: str, identifier: str) -> dict[str, str]:
    """The structured journal fields for one record; `extra={...}` keys become upper-case fields."""
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(journal_priority(record.levelno)),
        "SYSLOG_IDENTIFIER": identifier,
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
        "THREAD_NAME": record.threadName or "",
    }
    for key, value in record.__dict__.items():
        if key in _RECORD_ATTRS or key.startswith("_"):
            continue
        name = "".join(c if c.isalnum() else "_" for c in key.upper()).lstrip("_0123456789")[:64]
        if name and name not in fields:
            fields[name] = str(value)
    return fields


def encode_journal_fields(fields: Mapping[str, str]) -> bytes:
    """Encode fields in journald's native protocol (values with newlines get the length-prefixed form)."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalFieldsHandler(logging.Handler):
    """Logs each record to journald as structured fields: via systemd-python, or the native socket protocol."""

    def __init__(self, identifier: str = "appliance", socket_path: str = JOURNAL_SOCKET,
                 backend: str = "auto", level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.identifier = identifier
        self.socket_path = socket_path
        self._use_libsystemd = backend != "socket" and _sd_journal is not None and socket_path == JOURNAL_SOCKET
        self._sock: socket.socket | None = None
        self._fallback = logging.StreamHandler(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        """Send the record; if journald refuses it (too large, gone), write it to stderr instead."""
        try:
            message = self.format(record)
            fields = journal_fields(record, message, self.identifier)
            if self._use_libsystemd:
                _sd_journal.sendv(*(f"{k}={v}" for k, v in fields.items()))
                return
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(encode_journal_fields(fields), self.socket_path)
        except OSError:
            self._fallback.emit(record)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        """Close the journal socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        super().close()


def setup_logging(level: str | int = "INFO", environ: Mapping[str, str] | None = None,
                  identifier: str = "appliance", journal_socket: str = JOURNAL_SOCKET) -> logging.Handler:
    """Configure the root logger: journald with structured fields under systemd, plain stderr lines otherwise."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_appliance_handler", False):
            root.removeHandler(handler)
            handler.close()
    new: logging.Handler
    if under_journald(environ) and os.path.exists(journal_socket):
        new = JournalFieldsHandler(identifier, journal_socket)
        new.setFormatter(logging.Formatter("%(message)s"))
    else:
        new = logging.StreamHandler(sys.stderr)
        new.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    setattr(new, "_appliance_handler", True)  # noqa: B010 - marks the handler a re-run replaces
    root.addHandler(new)
    root.setLevel(level if isinstance(level, int) else level.upper())
    return new
