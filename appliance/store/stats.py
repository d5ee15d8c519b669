"""Group-commit counters: commits, ops, batch sizes, commit latency and fsync rate over a sliding window."""

from __future__ import annotations

import threading
import time
from collections import deque

WINDOW = 1024  # commits kept for latency percentiles and the fsync rate


class CommitStats:
    """Updated by the writer thread once per commit; read from any thread through snapshot()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commits = 0
        self.ops = 0
        self.elided = 0
        self.callbacks = 0
        self.batch_last = 0
        self.batch_max = 0
        self.latency_total = 0.0
        self._latencies: deque[float] = deque(maxlen=WINDOW)
        self._ends: deque[float] = deque(maxlen=WINDOW)

    def record(self, ops: int, elided: int, callbacks: int, started: float, ended: float) -> None:
        """Account one committed transaction of `ops` operations (ops counts elided ones too)."""
        with self._lock:
            self.commits += 1
            self.ops += ops
            self.elided += elided
            self.callbacks += callbacks
            self.batch_last = ops
            self.batch_max = max(self.batch_max, ops)
            self.latency_total += ended - started
            self._latencies.append(ended - started)
            self._ends.append(ended)

    def record_callbacks_only(self, callbacks: int) -> None:
        """Account callbacks released without a transaction (nothing was written before them)."""
        with self._lock:
            self.callbacks += callbacks

    def snapshot(self, pending: int, failed: bool) -> dict[str, float]:
        """Counters and derived figures as a flat dict (latencies in milliseconds)."""
        with self._lock:
            latencies = sorted(self._latencies)
            ends = list(self._ends)
            out: dict[str, float] = {
                "commits": float(self.commits),
                "ops": float(self.ops),
                "ops_elided": float(self.elided),
                "callbacks": float(self.callbacks),
                "batch_last": float(self.batch_last),
                "batch_mean": self.ops / self.commits if self.commits else 0.0,
                "batch_max": float(self.batch_max),
                "commit_latency_mean_ms": 1000.0 * self.latency_total / self.commits if self.commits else 0.0,
            }
        out["commit_latency_p99_ms"] = 1000.0 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0
        out["commit_latency_max_ms"] = 1000.0 * latencies[-1] if latencies else 0.0
        now = time.monotonic()
        recent = [t for t in ends if now - t <= 10.0]
        if len(recent) >= 2:
            span = max(now - recent[0], 1e-6)
            out["fsyncs_per_s"] = len(recent) / span
        else:
            out["fsyncs_per_s"] = float(len(recent)) / 10.0
        out["pending"] = float(pending)
        out["failed"] = 1.0 if failed else 0.0
        return out
