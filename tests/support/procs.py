"""Bounded line-by-line reading of a child process's stdout, for clients that print when they are ready."""

from __future__ import annotations

import contextlib
import queue
import signal
import subprocess
import threading
import time


class LineReader:
    """Collect a process's stdout lines on a thread; wait for them with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        """Start reading proc.stdout (which must be a text pipe)."""
        assert proc.stdout is not None
        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        """Move lines from the pipe into the queue; None marks end of file."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float = 10.0) -> str:
        """The next stdout line; AssertionError on EOF or after timeout seconds."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout} s; seen so far: {self.seen!r}") from None
        if line is None:
            self.lines.put(None)
            err = self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""
            raise AssertionError(f"process ended (rc={self.proc.poll()}); seen: {self.seen!r}; stderr: {err!r}")
        self.seen.append(line)
        return line

    def wait_for(self, predicate_text: str, timeout: float = 10.0) -> str:
        """Skip lines until one contains predicate_text; return it. Bounded by timeout in total."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(max(0.01, deadline - time.monotonic()))
            if predicate_text in line:
                return line

    def lines_starting(self, prefix: str, count: int, timeout: float = 10.0) -> list[str]:
        """The next count lines that start with prefix (prefix stripped), skipping the others."""
        deadline = time.monotonic() + timeout
        found: list[str] = []
        while len(found) < count:
            line = self.next_line(max(0.01, deadline - time.monotonic()))
            if line.startswith(prefix):
                found.append(line[len(prefix):])
        return found


def finish(proc: subprocess.Popen[str], timeout: float = 10.0) -> int:
    """Wait for proc to exit (SIGKILL after timeout) and return its exit code."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout)


def kill_hard(proc: subprocess.Popen[str]) -> None:
    """SIGKILL proc (its sockets close without an MQTT DISCONNECT) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)
