"""The single exception root of the cluster adapter, and its few specific kinds."""

from __future__ import annotations


class ClusterError(Exception):
    """Anything the cluster layer refuses: bad bytes from a peer, a failed handshake, a broken clock."""


class WireError(ClusterError):
    """A frame or message body that cannot be decoded, or a message out of place in the link protocol."""


class AuthFailed(ClusterError):
    """A peer that did not prove knowledge of the cluster secret (or belongs to another cluster / version)."""
