"""The nemesis: one fault at a time on a seeded random schedule (kill -9 + restart, SIGSTOP / SIGCONT, partitions)."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .nodes import Nodes

SINGLE_NODE_OPS = ("kill", "stop")
CLUSTER_OPS = ("kill", "stop", "partition", "isolate")


@dataclass
class Nemesis:
    """Applies faults to `nodes` until a deadline; every fault is undone before the next one starts."""

    nodes: Nodes
    rng: random.Random
    gap_s: tuple[float, float] = (0.5, 2.5)  # healthy time between faults
    hold_s: tuple[float, float] = (0.3, 3.0)  # how long a fault lasts
    ops: tuple[str, ...] = ()
    log: list[dict[str, Any]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if not self.ops:
            self.ops = SINGLE_NODE_OPS if self.nodes.n == 1 else CLUSTER_OPS

    def counts(self) -> Counter[str]:
        """Faults applied per kind."""
        return Counter(entry["op"] for entry in self.log)

    def _sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - time.monotonic()))

    def run(self, until: float) -> None:
        """Apply faults until monotonic time `until` (the last one is undone by then)."""
        while True:
            start = time.monotonic() + self.rng.uniform(*self.gap_s)
            hold = self.rng.uniform(*self.hold_s)
            if start + hold > until:
                self._sleep_until(until)
                return
            self._sleep_until(start)
            self.apply(self.rng.choice(self.ops), hold)

    def apply(self, op: str, hold: float) -> None:
        """One fault: apply, hold for `hold` seconds, undo."""
        n = self.nodes.n
        node = self.rng.randrange(n)
        entry: dict[str, Any] = {"op": op, "node": node, "t": round(time.monotonic() - self.t0, 2),
                                 "hold": round(hold, 2)}
        if op == "kill":
            self.nodes.kill(node)
            time.sleep(hold)
            t = time.monotonic()
            self.nodes.start(node)
            entry["restart_s"] = round(time.monotonic() - t, 2)
        elif op == "stop":
            self.nodes.stop(node)
            time.sleep(hold)
            self.nodes.cont(node)
        elif op == "partition":
            other = self.rng.choice([j for j in range(n) if j != node])
            entry["other"] = other
            self.nodes.partition(node, other)
            entry["applied"] = round(time.monotonic() - self.t0, 2)
            time.sleep(hold)
            self.nodes.heal_all()
        elif op == "isolate":
            for j in range(n):
                if j != node:
                    self.nodes.partition(node, j)
            entry["applied"] = round(time.monotonic() - self.t0, 2)
            time.sleep(hold)
            self.nodes.heal_all()
        else:
            raise ValueError(f"unknown nemesis op {op!r}")
        entry["end"] = round(time.monotonic() - self.t0, 2)  # undone (under load, later than t + hold)
        self.log.append(entry)

    def heal(self) -> None:
        """Leave every node running, continued and connected."""
        self.nodes.heal_all()
        for i in range(self.nodes.n):
            if self.nodes.alive(i):
                self.nodes.cont(i)
            else:
                self.nodes.start(i)
