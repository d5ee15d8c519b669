"""Cluster membership as this node sees it, and deterministic placement of sessions on members.

Known members come from discovery or seeds (with addresses), liveness from the peer links. Every node computes
`placement(key, r)` from the same live set with rendezvous (highest-random-weight) hashing, so all agree on a
session's owner and replicas without coordination, and a node joining or leaving moves only the keys it held.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass


def _weight(key: str, node: str) -> int:
    """The rendezvous score of one node for one key."""
    digest = hashlib.blake2b(f"{node}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(key: str, nodes: list[str] | set[str] | tuple[str, ...], r: int) -> list[str]:
    """The r nodes with the highest score for `key`, best first (owner, then replicas); fewer if fewer nodes."""
    ranked = sorted(nodes, key=lambda n: (_weight(key, n), n), reverse=True)
    return ranked[: max(0, r)]


@dataclass(slots=True)
class Member:
    """One node of the cluster."""

    node_id: str
    address: tuple[str, int] | None = None  # peer-link address
    mqtt_port: int | None = None
    up: bool = False  # authenticated link open (always True for ourselves)
    changed_at: float = 0.0  # monotonic time of the last up/down change


class Membership:
    """The members this node knows of and which are reachable; `version` grows on every change."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.version = 0
        self._members: dict[str, Member] = {node_id: Member(node_id, up=True, changed_at=time.monotonic())}

    def known(self, node_id: str, address: tuple[str, int] | None = None, mqtt_port: int | None = None) -> None:
        """A member was discovered / configured (or its address changed)."""
        m = self._members.get(node_id)
        if m is None:
            self._members[node_id] = Member(node_id, address, mqtt_port, changed_at=time.monotonic())
            self.version += 1
            return
        if address is not None:
            m.address = address
        if mqtt_port is not None:
            m.mqtt_port = mqtt_port

    def set_up(self, node_id: str, up: bool) -> bool:
        """Record a link going up or down; True if that changed the live set."""
        if node_id == self.node_id:
            return False
        m = self._members.setdefault(node_id, Member(node_id))
        if m.up == up:
            return False
        m.up = up
        m.changed_at = time.monotonic()
        self.version += 1
        return True

    def forget(self, node_id: str) -> None:
        """Remove a member for good (decommissioned); not for a node that is merely down."""
        if node_id != self.node_id and self._members.pop(node_id, None) is not None:
            self.version += 1

    def live(self) -> list[str]:
        """Reachable members, ourselves included, sorted."""
        return sorted(n for n, m in self._members.items() if m.up)

    def all(self) -> list[str]:
        """Every known member, reachable or not, sorted."""
        return sorted(self._members)

    def member(self, node_id: str) -> Member | None:
        """One member's record."""
        return self._members.get(node_id)

    def placement(self, key: str, r: int, *, live_only: bool = True) -> list[str]:
        """Owner first, then replicas, for a session key (client id): rendezvous over live (or all) members."""
        return rendezvous(key, self.live() if live_only else self.all(), r)

    def unreachable(self) -> list[str]:
        """Known members whose link is down."""
        return sorted(n for n, m in self._members.items() if not m.up)
