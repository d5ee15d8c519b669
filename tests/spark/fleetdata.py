"""Build small delivery-log datasets by hand (records as dicts) and write them as uploaded segments."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

T0 = 1_795_136_400_000_000  # 2026-11-20T01:00:00Z
MS, S = 1_000, 1_000_000


class Node:
    """A broker node (or client) with its own boot, monotonic clock and a wall clock that may be off until a sync."""

    def __init__(self, name: str, device: str, firmware: str = "1.0", source: str = "broker",
                 skew_us: int = 0, synced_from_us: int | None = 0, fleet: str = "f1") -> None:
        self.name, self.device, self.firmware, self.source, self.fleet = name, device, firmware, source, fleet
        self.boot = f"{name}-boot"
        self.skew_us, self.synced_from_us = skew_us, synced_from_us
        self.mono_base = 5 * S + 123  # boot happened some seconds before T0 - 1h
        self.counter = 0

    def event(self, kind: str, true_us: int, **fields: Any) -> dict[str, Any]:
        """A valid v1 record for something that happened on this node at true time true_us."""
        self.counter += 1
        synced = self.synced_from_us is not None and true_us >= self.synced_from_us
        return {"event_id": f"{self.name}:{self.boot}:{self.counter}", "schema_version": 1, "source": self.source,
                "fleet": self.fleet, "device": self.device, "node": self.name, "firmware": self.firmware,
                "boot_id": self.boot, "ts_wall_us": true_us + (0 if synced else self.skew_us),
                "ts_mono_us": true_us - T0 + 3600 * S + self.mono_base, "clock_synced": synced, "kind": kind,
                **fields}


def write_segment(root: Path, records: list[dict[str, Any]] | list[str], fleet: str = "f1",
                  date: str = "2026-11-20", device: str = "d1", name: str = "seg-0001") -> Path:
    """Write records (dicts, or raw lines as given) as one gzip JSON Lines segment under Hive-style keys."""
    d = root / f"fleet={fleet}" / f"date={date}" / f"device={device}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.jsonl.gz"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    with gzip.open(path, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def write_by_device(root: Path, records: list[dict[str, Any]], name: str = "seg-0001") -> None:
    """Write records as one segment per device, the way devices upload them."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["fleet"], r["device"]), []).append(r)
    for (fleet, device), recs in by.items():
        write_segment(root, recs, fleet=fleet, device=device, name=name)
