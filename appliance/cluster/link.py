"""Sans-I/O peer link: mutual challenge-response authentication, heartbeats and failure detection over wire frames.

Handshake (both sides send Hello at once, then the dialling side proves first, so a node that merely connects to us
gets nothing but our Hello):

    initiator -> Hello(cluster, id_i, version, incarnation_i, nonce_i)   <- Hello(cluster, id_r, ..., nonce_r) responder
    initiator -> Auth(mac("I", id_i, id_r))          responder verifies, then -> Auth(mac("R", id_r, id_i))
    mac = HMAC-SHA256(secret, label | role | cluster | sender | receiver | nonce_i | nonce_r | binding)

`binding` names the TCP connection (initiator address:port > responder address:port, as both sides see it on a LAN
without NAT), so a proof captured on one connection cannot be relayed onto another. Macs are compared in constant time.
Any failure raises AuthFailed: the caller closes the connection and logs it, sending nothing more.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import os
from dataclasses import dataclass

from .errors import AuthFailed, WireError
from .wire import (
    DEFAULT_MAX_FRAME,
    PROTOCOL_VERSION,
    Auth,
    ClusterMessage,
    FrameDecoder,
    Goodbye,
    Heartbeat,
    HeartbeatAck,
    Hello,
    encode,
)

NONCE_SIZE = 32
PREAUTH_MAX_FRAME = 4096  # an unauthenticated peer cannot make us buffer more than this
_LABEL = b"appliance-cluster-auth-v1"


def channel_binding(initiator: tuple[str, int], responder: tuple[str, int]) -> bytes:
    """Canonical name of one TCP connection from its two endpoints (IPv4-mapped IPv6 folded to IPv4)."""

    def norm(addr: tuple[str, int]) -> str:
        host = addr[0].split("%", 1)[0]
        try:
            ip = ipaddress.ip_address(host)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            host = str(ip)
        except ValueError:
            pass
        return f"{host}:{addr[1]}"

    return f"{norm(initiator)}>{norm(responder)}".encode()


def compute_mac(secret: bytes, role: bytes, cluster: str, sender: str, receiver: str, nonce_i: bytes,
                nonce_r: bytes, binding: bytes) -> bytes:
    """The proof one side sends; role is b"I" (initiator) or b"R" (responder)."""
    h = hmac.new(secret, _LABEL, hashlib.sha256)
    for part in (role, cluster.encode(), sender.encode(), receiver.encode(), nonce_i, nonce_r, binding):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()


class LinkState(enum.Enum):
    """Where a link stands."""

    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Authenticated:
    """Event: the peer proved the secret; messages may flow."""

    peer_id: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class Received:
    """Event: an application message from the authenticated peer."""

    message: ClusterMessage


@dataclass(frozen=True, slots=True)
class PeerLeft:
    """Event: the peer said Goodbye (orderly shutdown, not a failure)."""

    reason: str


Event = Authenticated | Received | PeerLeft


class LinkCore:
    """One side of one peer connection, with no I/O: feed bytes and clock readings, take bytes to send."""

    def __init__(self, *, node_id: str, cluster: str, secret: bytes, initiator: bool, now: float,
                 incarnation: int = 0, binding: bytes = b"", expected_peer: str | None = None,
                 heartbeat_interval: float = 1.0, timeout: float = 5.0, max_frame: int = DEFAULT_MAX_FRAME,
                 nonce: bytes | None = None) -> None:
        if not secret:
            raise ValueError("cluster secret must not be empty")
        self.node_id = node_id
        self.cluster = cluster
        self.initiator = initiator
        self.incarnation = incarnation
        self.expected_peer = expected_peer
        self.heartbeat_interval = heartbeat_interval
        self.timeout = timeout
        self.state = LinkState.HANDSHAKE
        self.peer_id: str | None = None
        self.claimed_peer: str | None = None  # the node id the peer's Hello named, even if refused
        self.peer_incarnation = 0
        self.rtt: float | None = None
        self.last_received = now
        self._last_heartbeat = now
        self._secret = secret
        self._binding = binding
        self._max_frame = max_frame
        self._nonce = nonce if nonce is not None else os.urandom(NONCE_SIZE)
        self._peer_nonce: bytes | None = None
        self._decoder = FrameDecoder(PREAUTH_MAX_FRAME)
        self._out = bytearray(encode(Hello(cluster, node_id, PROTOCOL_VERSION, incarnation, self._nonce)))

    # -- output --------------------------------------------------------------------------------------------------
    def take_outgoing(self) -> bytes:
        """Bytes queued for the peer since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def send(self, msg: ClusterMessage) -> None:
        """Queue an application message; only on an open link."""
        if self.state is not LinkState.OPEN:
            raise WireError(f"cannot send {type(msg).__name__} on a {self.state.value} link")
        self._out += encode(msg)

    def send_frame(self, frame: bytes) -> None:
        """Queue an already encoded application frame; only on an open link."""
        if self.state is not LinkState.OPEN:
            raise WireError(f"cannot send a frame on a {self.state.value} link")
        self._out += frame

    def close(self, reason: str = "") -> None:
        """Queue a Goodbye (if open) and refuse further traffic."""
        if self.state is LinkState.OPEN:
            self._out += encode(Goodbye(reason))
        self.state = LinkState.CLOSED

    # -- timers --------------------------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Queue a heartbeat if one is due. Call at least every heartbeat_interval."""
        if self.state is LinkState.OPEN and now - self._last_heartbeat >= self.heartbeat_interval:
            self._last_heartbeat = now
            self._out += encode(Heartbeat(int(now * 1_000_000) & 0xFFFF_FFFF_FFFF_FFFF))

    def expired(self, now: float) -> bool:
        """True when nothing arrived from the peer within the timeout (handshake included): treat it as failed."""
        return now - self.last_received > self.timeout

    def next_deadline(self, now: float) -> float:
        """Seconds until the caller should call tick()/expired() again."""
        until_beat = self._last_heartbeat + self.heartbeat_interval - now
        until_dead = self.last_received + self.timeout - now
        return max(0.0, min(until_beat, until_dead))

    # -- input ---------------------------------------------------------------------------------------------------
    def receive_data(self, data: bytes, now: float) -> list[Event]:
        """Feed bytes from the peer; return the events they complete. Raises AuthFailed or WireError (then close)."""
        if self.state is LinkState.CLOSED:
            return []
        if data:
            self.last_received = now
        self._decoder.feed(data)
        events: list[Event] = []
        while self.state is not LinkState.CLOSED and (msg := self._decoder.pop()) is not None:
            if self.state is LinkState.HANDSHAKE:
                ev = self._handshake(msg)
                if ev is not None:
                    events.append(ev)
            else:
                self._open_message(msg, now, events)
        return events

    def _open_message(self, msg: ClusterMessage, now: float, events: list[Event]) -> None:
        """Handle one message on an authenticated link."""
        if isinstance(msg, Heartbeat):
            self._out += encode(HeartbeatAck(msg.stamp))
        elif isinstance(msg, HeartbeatAck):
            sent = msg.stamp / 1_000_000
            if 0 <= now - sent < 3600:
                self.rtt = now - sent
        elif isinstance(msg, Goodbye):
            self.state = LinkState.CLOSED
            events.append(PeerLeft(msg.reason))
        elif isinstance(msg, Hello | Auth):
            raise WireError(f"{type(msg).__name__} after the handshake")
        else:
            events.append(Received(msg))

    def _mac(self, role: bytes, sender: str, receiver: str) -> bytes:
        """The mac for one direction of this connection."""
        assert self._peer_nonce is not None
        nonce_i, nonce_r = (self._nonce, self._peer_nonce) if self.initiator else (self._peer_nonce, self._nonce)
        return compute_mac(self._secret, role, self.cluster, sender, receiver, nonce_i, nonce_r, self._binding)

    def _handshake(self, msg: ClusterMessage) -> Authenticated | None:
        """Advance the handshake by one message."""
        if self._peer_nonce is None:
            if not isinstance(msg, Hello):
                raise AuthFailed(f"expected Hello, got {type(msg).__name__}")
            self.claimed_peer = msg.node_id
            self._check_hello(msg)
            self.peer_id = msg.node_id
            self.peer_incarnation = msg.incarnation
            self._peer_nonce = msg.nonce
            if self.initiator:
                self._out += encode(Auth(self._mac(b"I", self.node_id, msg.node_id)))
            return None
        if not isinstance(msg, Auth):
            raise AuthFailed(f"expected Auth, got {type(msg).__name__}")
        assert self.peer_id is not None
        role = b"R" if self.initiator else b"I"
        if not hmac.compare_digest(msg.mac, self._mac(role, self.peer_id, self.node_id)):
            raise AuthFailed(f"peer {self.peer_id!r} failed the cluster-secret challenge")
        if not self.initiator:
            self._out += encode(Auth(self._mac(b"R", self.node_id, self.peer_id)))
        self.state = LinkState.OPEN
        self._decoder.max_frame = self._max_frame
        return Authenticated(self.peer_id, self.peer_incarnation)

    def _check_hello(self, hello: Hello) -> None:
        """Refuse peers of another cluster or version, ourselves, and a node other than the one we dialled."""
        if hello.cluster != self.cluster:
            raise AuthFailed(f"peer is in cluster {hello.cluster!r}, not {self.cluster!r}")
        if hello.version != PROTOCOL_VERSION:
            raise AuthFailed(f"peer speaks cluster protocol {hello.version}, we speak {PROTOCOL_VERSION}")
        if hello.node_id == self.node_id:
            raise AuthFailed("connected to ourselves")
        if self.expected_peer is not None and hello.node_id != self.expected_peer:
            raise AuthFailed(f"dialled {self.expected_peer!r} but {hello.node_id!r} answered")
        if len(hello.nonce) != NONCE_SIZE:
            raise AuthFailed("bad nonce size")
        if not hello.node_id:
            raise AuthFailed("empty node id")
