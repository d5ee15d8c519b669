"""Counters and gauges of the broker rules, read by the Prometheus endpoint and $SYS publisher."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class Metrics:
    """Plain counters; the server renders them, the rules only increment them."""

    messages_in: list[int] = field(default_factory=lambda: [0, 0, 0])  # by QoS
    messages_out: list[int] = field(default_factory=lambda: [0, 0, 0])
    bytes_in: int = 0
    bytes_out: int = 0
    connects: int = 0
    connects_refused: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    drops: Counter[str] = field(default_factory=Counter)
    wills_published: int = 0
    sessions_expired: int = 0

    def drop(self, reason: str, count: int = 1) -> None:
        """Count a message dropped for `reason` (queue_full, acl, too_large, expired, ...)."""
        self.drops[reason] += count
