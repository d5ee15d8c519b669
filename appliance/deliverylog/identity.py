"""Who writes a log (fleet, device, node, firmware, boot id) and whether the wall clock is NTP-synchronised."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from dataclasses import dataclass

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
TIMESYNC_FLAG = "/run/systemd/timesync/synchronized"
_TIME_ERROR = 5  # adjtimex(2) return value: clock not synchronised


@dataclass(frozen=True, slots=True)
class Identity:
    """The constant part of every record a writer produces."""

    fleet: str
    device: str
    node: str  # broker node name, or the client id for source="client"
    firmware: str
    boot_id: str
    source: str = "broker"  # "broker" | "client"


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's random id of the current boot."""
    with open(path, encoding="ascii") as f:
        return f.read().strip()


def _adjtimex_probe() -> Callable[[], bool] | None:
    """A function asking the kernel (adjtimex, read-only) whether the clock is synchronised, or None if unavailable."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        adjtimex = libc.adjtimex
    except (OSError, AttributeError):
        return None
    buf = ctypes.create_string_buffer(512)  # >= sizeof(struct timex); modes (first field) = 0: read only

    def probe() -> bool:
        ctypes.memset(buf, 0, ctypes.sizeof(buf))
        state = adjtimex(buf)
        return state >= 0 and state != _TIME_ERROR

    try:
        probe()
    except OSError:
        return None
    return probe


def clock_sync_probe(override: bool | None = None, flag_path: str = TIMESYNC_FLAG) -> Callable[[], bool]:
    """A cheap callable telling whether the wall clock is synchronised now.

    `override` (from config) wins; otherwise systemd-timesyncd's flag file, then the kernel's adjtimex state
    (which chrony and ntpd also maintain).
    """
    if override is not None:
        return lambda: override
    kernel = _adjtimex_probe()

    def probe() -> bool:
        if os.path.exists(flag_path):
            return True
        return kernel() if kernel is not None else False

    return probe
