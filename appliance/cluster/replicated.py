"""One replicated key space (subscriptions, retained messages) on one node: DVV clocks, anti-entropy, tombstone GC.

Sans-I/O: the caller persists what the methods return (changed clocks, the event counter) and carries digests and
clocks over peer links (wire.Digest / RepairRequest / Repair).

Anti-entropy round between this node and a peer: send `digest()`; on the peer's digest, `observe_digest()` then
`plan_repair()` says which of our clocks to push and which of theirs to request; `merge()` what arrives.

Garbage collection of tombstones: every member's digest vectors are remembered per key. A key holding only
tombstones is dropped once every member's remembered vector has seen its whole clock. The dropped key's vector is
kept for `grace` seconds and advertised in our digests as `collected`, so that (1) members that collected later can
still see we had it, and (2) a stale copy still in flight is recognised (dominated by that vector) and ignored
instead of resurrecting the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import dvv
from .dvv import EMPTY, DVVSet, VersionVector


@dataclass(slots=True)
class RepairPlan:
    """What one digest comparison asks for: our clocks to push, and keys whose clocks to request."""

    push: list[str] = field(default_factory=list)
    request: list[str] = field(default_factory=list)


class ReplicatedSpace:
    """The DVV state of one key space on one node."""

    def __init__(self, name: str, node_id: str, *, counter: int = 0, clocks: Mapping[str, DVVSet] | None = None,
                 collected: Mapping[str, tuple[VersionVector, float]] | None = None, grace: float = 600.0) -> None:
        self.name = name
        self.node_id = node_id
        self.counter = counter  # this node's event counter for the space; persist it with every local write
        self.grace = grace
        self._clocks: dict[str, DVVSet] = dict(clocks or {})
        self._collected: dict[str, tuple[VersionVector, float]] = dict(collected or {})
        self._member_vv: dict[str, dict[str, VersionVector]] = {}  # member -> key -> last advertised vector

    # -- reads ---------------------------------------------------------------------------------------------------
    def clock(self, key: str) -> DVVSet:
        """The key's clock (EMPTY if unknown)."""
        return self._clocks.get(key, EMPTY)

    def value(self, key: str, order_key: Callable[[bytes], Any] | None = None) -> bytes | None:
        """The resolved value (dvv.resolve's rule), None if absent or deleted."""
        return dvv.resolve(self.clock(key), order_key)

    def items(self, order_key: Callable[[bytes], Any] | None = None) -> dict[str, bytes]:
        """Every live key with its resolved value."""
        out = {}
        for key, clock in self._clocks.items():
            v = dvv.resolve(clock, order_key)
            if v is not None:
                out[key] = v
        return out

    def clocks(self) -> dict[str, DVVSet]:
        """All clocks held (tombstones included), for persistence and convergence checks."""
        return dict(self._clocks)

    def collected(self) -> dict[str, tuple[VersionVector, float]]:
        """Recently collected keys: key -> (final vector, when); persist to keep stale copies out across restarts."""
        return dict(self._collected)

    # -- local writes --------------------------------------------------------------------------------------------
    def put(self, key: str, value: bytes, context: Mapping[str, int] | None = None) -> DVVSet:
        """Write locally; with no context the write supersedes everything this node has seen of the key."""
        return self._write(key, value, context)

    def delete(self, key: str, context: Mapping[str, int] | None = None) -> DVVSet:
        """Delete locally (a tombstone write)."""
        return self._write(key, None, context)

    def _write(self, key: str, value: bytes | None, context: Mapping[str, int] | None) -> DVVSet:
        """One local update: bump the counter floor so dots stay unique across GC."""
        current = self.clock(key)
        ctx = dvv.join(current) if context is None else context
        floor = max(self.counter, self._collected.get(key, ({}, 0.0))[0].get(self.node_id, 0))
        clock = dvv.update(current, ctx, value, self.node_id, floor)
        self.counter = max(self.counter, dvv.dot_of_last_write(clock, self.node_id))
        self._clocks[key] = clock
        self._collected.pop(key, None)
        return clock

    # -- replication ---------------------------------------------------------------------------------------------
    def merge(self, key: str, remote: DVVSet) -> DVVSet | None:
        """Sync a remote clock into ours; return the new clock if it changed, else None (also for stale copies)."""
        gone = self._collected.get(key)
        if gone is not None and dvv.descends(gone[0], dvv.join(remote)):
            return None  # a copy of what we already collected: must not resurrect it
        current = self.clock(key)
        merged = dvv.sync(current, remote)
        if merged == current:
            return None
        self._clocks[key] = merged
        self._collected.pop(key, None)
        return merged

    def merge_many(self, clocks: Iterable[tuple[str, DVVSet]]) -> dict[str, DVVSet]:
        """merge() each; return the keys that changed with their new clocks."""
        changed = {}
        for key, clock in clocks:
            new = self.merge(key, clock)
            if new is not None:
                changed[key] = new
        return changed

    def digest(self) -> tuple[tuple[tuple[str, VersionVector], ...], tuple[tuple[str, VersionVector], ...]]:
        """(entries, collected): our vector per key held, and per recently collected key, both sorted."""
        entries = tuple(sorted((k, dvv.join(c)) for k, c in self._clocks.items()))
        collected = tuple(sorted((k, vv) for k, (vv, _) in self._collected.items()))
        return entries, collected

    def observe_digest(self, member: str, entries: Iterable[tuple[str, VersionVector]],
                       collected: Iterable[tuple[str, VersionVector]] = ()) -> None:
        """Remember what a member advertised (for GC); keys it no longer lists keep their last vector."""
        known = self._member_vv.setdefault(member, {})
        for key, vv in (*entries, *collected):
            known[key] = dict(vv)

    def plan_repair(self, entries: Iterable[tuple[str, VersionVector]], complete: bool = True,
                    collected: Iterable[tuple[str, VersionVector]] = ()) -> RepairPlan:
        """Compare a peer's digest with our state. `complete`: the digest lists all its keys (else skip absentees)."""
        plan = RepairPlan()
        remote = dict(entries)
        remote_collected = dict(collected)
        for key, rvv in remote.items():
            gone = self._collected.get(key)
            if gone is not None and dvv.descends(gone[0], rvv):
                continue  # they still hold a tombstone we collected; our advertised vector lets them collect it
            local = dvv.join(self.clock(key))
            if not dvv.descends(rvv, local):
                plan.push.append(key)
            if not dvv.descends(local, rvv):
                plan.request.append(key)
        if complete:
            for key in self._clocks:
                if key in remote:
                    continue
                lost = remote_collected.get(key)
                if lost is not None and dvv.descends(lost, dvv.join(self._clocks[key])):
                    continue  # they collected it after seeing everything we have
                plan.push.append(key)
        plan.push.sort()
        plan.request.sort()
        return plan

    def clocks_for(self, keys: Iterable[str]) -> tuple[tuple[str, DVVSet], ...]:
        """(key, clock) for the keys we hold among `keys`, for a Repair message."""
        return tuple((k, self._clocks[k]) for k in keys if k in self._clocks)

    # -- garbage collection --------------------------------------------------------------------------------------
    def collect_garbage(self, members: Iterable[str], now: float) -> list[str]:
        """Drop tombstone-only keys that every other current member has seen; forget old collected entries."""
        others = [m for m in members if m != self.node_id]
        removed = []
        for key, clock in list(self._clocks.items()):
            if not dvv.is_deleted(clock):
                continue
            vectors = [self._member_vv.get(m, {}).get(key) for m in others]
            if any(v is None for v in vectors):
                continue
            if dvv.collectable(clock, [v for v in vectors if v is not None]):
                del self._clocks[key]
                self._collected[key] = (dvv.join(clock), now)
                removed.append(key)
        for key, (_, when) in list(self._collected.items()):
            if now - when > self.grace:
                del self._collected[key]
        return removed

    def forget_member(self, member: str) -> None:
        """A node left the membership for good: stop waiting for it in GC."""
        self._member_vv.pop(member, None)
