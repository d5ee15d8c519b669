"""LAN discovery with python-zeroconf: announce this node (cluster service + `_mqtt._tcp`), browse for peers.

Each node registers `<node>@<cluster>._appl-cluster._tcp.local.` with TXT records cluster, node, proto, cport
(peer-link port), mqtt and mqtts (client ports), plus `_mqtt._tcp` (and `_secure-mqtt._tcp` when TLS is on) so LAN
clients can find a broker. The browser reports peers of our cluster name through on_add / on_update / on_remove and
ignores every other cluster. A peer is removed when its records expire (after `ttl` seconds without an answer) or
when it says goodbye. Static seeds (`parse_seeds`) stand in where multicast is blocked: hand them to the link layer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import ifaddr
from zeroconf import DNSOutgoing, DNSQuestion, IPVersion, ServiceStateChange, Zeroconf, current_time_millis
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf
from zeroconf.const import _CLASS_IN, _FLAGS_QR_QUERY, _TYPE_PTR, _TYPE_SRV

from .wire import PROTOCOL_VERSION

CLUSTER_SERVICE = "_appl-cluster._tcp.local."
MQTT_SERVICE = "_mqtt._tcp.local."
SECURE_MQTT_SERVICE = "_secure-mqtt._tcp.local."
DEFAULT_TTL = 120  # seconds, RFC 6762's host record TTL
RESOLVE_TIMEOUT_MS = 3000

_LOG = logging.getLogger("appliance.cluster.discovery")


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """A peer as announced on the LAN."""

    node_id: str
    cluster: str
    version: int
    addresses: tuple[str, ...]  # IPv4 first
    cluster_port: int
    mqtt_port: int | None
    mqtts_port: int | None


OnPeer = Callable[[PeerInfo], None]
OnRemove = Callable[[str], None]


def build_txt(cluster: str, node_id: str, cluster_port: int, mqtt_port: int | None,
              mqtts_port: int | None) -> dict[str, str]:
    """The TXT records this node announces on its cluster service."""
    txt = {"cluster": cluster, "node": node_id, "proto": str(PROTOCOL_VERSION), "cport": str(cluster_port)}
    if mqtt_port is not None:
        txt["mqtt"] = str(mqtt_port)
    if mqtts_port is not None:
        txt["mqtts"] = str(mqtts_port)
    return txt


def parse_peer(txt: Mapping[bytes, bytes | None], addresses: Iterable[str]) -> PeerInfo | None:
    """Read a peer from its TXT records and addresses; None if anything required is missing or malformed."""
    fields = {k.decode(errors="replace"): (v or b"").decode(errors="replace") for k, v in txt.items()}
    try:
        cluster, node_id = fields["cluster"], fields["node"]
        version, cport = int(fields["proto"]), int(fields["cport"])
        mqtt = int(fields["mqtt"]) if "mqtt" in fields else None
        mqtts = int(fields["mqtts"]) if "mqtts" in fields else None
    except (KeyError, ValueError):
        return None
    addrs = sorted(set(addresses), key=lambda a: (ipaddress.ip_address(a).version, a))
    if not node_id or not cluster or not addrs or not 0 < cport < 65536:
        return None
    return PeerInfo(node_id, cluster, version, tuple(addrs), cport, mqtt, mqtts)


def parse_seeds(seeds: Iterable[str], default_port: int) -> list[tuple[str, int]]:
    """Config seed peers ("host", "host:port", "[v6]:port") -> (host, port); ValueError names a bad entry."""
    out: list[tuple[str, int]] = []
    for seed in seeds:
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:\s]+)(?::(\d+))?", seed.strip())
        if m is None:
            raise ValueError(f"bad seed peer {seed!r}: expected host[:port]")
        host = m.group(1) or m.group(3)
        port = int(m.group(2) or m.group(4) or default_port)
        if not 0 < port < 65536:
            raise ValueError(f"bad seed peer {seed!r}: port out of range")
        out.append((host, port))
    return out


def local_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this host (or network namespace)."""
    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                found.append(ip.ip)
    return sorted(set(found))


def _label(text: str) -> str:
    """A DNS host label made from arbitrary text."""
    return re.sub(r"[^A-Za-z0-9-]", "-", text).strip("-")[:63] or "node"


class Discovery:
    """Announce this node and browse for peers of the same cluster on the LAN (python-zeroconf, asyncio)."""

    def __init__(self, *, cluster: str, node_id: str, cluster_port: int, on_add: OnPeer, on_update: OnPeer,
                 on_remove: OnRemove, mqtt_port: int | None = None, mqtts_port: int | None = None,
                 addresses: list[str] | None = None, interfaces: list[str] | None = None,
                 ttl: int = DEFAULT_TTL, requery_interval: float | None = None) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.cluster_port = cluster_port
        self.mqtt_port = mqtt_port
        self.mqtts_port = mqtts_port
        self.ttl = ttl
        # Live peers' SRV records must be refreshed (by our queries) well before their TTL runs out.
        self.requery_interval = requery_interval if requery_interval is not None else ttl / 3
        if not 0 < self.requery_interval < ttl * 0.75:
            raise ValueError("requery_interval must be positive and under 3/4 of the TTL")
        self._addresses = addresses
        self._interfaces = interfaces
        self._on_add = on_add
        self._on_update = on_update
        self._on_remove = on_remove
        self._azc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._infos: list[AsyncServiceInfo] = []
        self._by_name: dict[str, PeerInfo] = {}
        self._silent: set[str] = set()  # services dropped for silence, watched for their return
        self._tasks: set[asyncio.Task[None]] = set()

    def peers(self) -> dict[str, PeerInfo]:
        """Peers currently known, by node id."""
        return {p.node_id: p for p in self._by_name.values()}

    async def async_start(self) -> None:
        """Register our services and start browsing."""
        addresses = self._addresses or local_ipv4_addresses()
        if not addresses:
            raise OSError("no non-loopback IPv4 address to announce")
        self._azc = AsyncZeroconf(interfaces=self._interfaces or addresses, ip_version=IPVersion.V4Only)
        host = f"appliance-{_label(self.node_id)}-{_label(self.cluster)}.local."
        packed = [socket.inet_aton(a) for a in addresses]
        txt = build_txt(self.cluster, self.node_id, self.cluster_port, self.mqtt_port, self.mqtts_port)
        self._infos = [self._info(CLUSTER_SERVICE, self.cluster_port, txt, host, packed)]
        client_txt = {"cluster": self.cluster, "node": self.node_id}
        for stype, port in ((MQTT_SERVICE, self.mqtt_port), (SECURE_MQTT_SERVICE, self.mqtts_port)):
            if port is not None:
                self._infos.append(self._info(stype, port, client_txt, host, packed))
        for info in self._infos:
            await (await self._azc.async_register_service(info, allow_name_change=True))
        # Query often enough that live peers' short-TTL records are refreshed before they expire.
        delay_ms = max(500, min(10_000, self.ttl * 1000 // 4))
        self._browser = AsyncServiceBrowser(self._azc.zeroconf, [CLUSTER_SERVICE], handlers=[self._state_changed],
                                            delay=delay_ms)
        self._spawn(self._async_requery_loop())

    async def _async_requery_loop(self) -> None:
        """Ask for cluster services every requery_interval, and drop peers whose SRV record has expired.

        python-zeroconf raises received PTR TTLs to at least 1125 s and its browser only re-queries to refresh
        records it holds, so neither would notice a silent peer soon nor find one again after a split heals. A
        plain question to the group (RFC 6762 section 5.2 continuous querying) refreshes every live peer's SRV
        record (host TTL); a peer whose SRV record lapsed has not answered for `ttl` seconds and is removed.
        """
        while self._azc is not None:
            await asyncio.sleep(self.requery_interval)
            if self._azc is None:  # closed while we slept
                return  # type: ignore[unreachable]
            self._async_expire_silent_peers()
            out = DNSOutgoing(_FLAGS_QR_QUERY)
            out.add_question(DNSQuestion(CLUSTER_SERVICE, _TYPE_PTR, _CLASS_IN))
            self._azc.zeroconf.async_send(out)

    def _info(self, stype: str, port: int, txt: dict[str, str], host: str, packed: list[bytes]) -> AsyncServiceInfo:
        """One service record set of ours, with our TTL."""
        instance = f"{self.node_id}@{self.cluster}"[:63]
        return AsyncServiceInfo(stype, f"{instance}.{stype}", port=port, properties=txt, server=host,
                                addresses=packed, host_ttl=self.ttl, other_ttl=self.ttl)

    async def async_stop(self) -> None:
        """Say goodbye (unregister), stop browsing and wait for every task."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._browser is not None:
            await self._browser.async_cancel()
        if self._azc is not None:
            await self._azc.async_unregister_all_services()
            await self._azc.async_close()
        self._browser = None
        self._azc = None

    async def async_update_ports(self, mqtt_port: int | None = None, mqtts_port: int | None = None) -> None:
        """Re-announce with new client ports (e.g. once the listeners are bound)."""
        self.mqtt_port, self.mqtts_port = mqtt_port, mqtts_port
        if self._azc is None or not self._infos:
            return
        old = self._infos[0]
        txt = build_txt(self.cluster, self.node_id, self.cluster_port, mqtt_port, mqtts_port)
        assert old.server is not None
        self._infos[0] = self._info(CLUSTER_SERVICE, self.cluster_port, txt, old.server, old.addresses)
        await (await self._azc.async_update_service(self._infos[0]))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Start a task and keep a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _state_changed(self, zeroconf: Zeroconf, service_type: str, name: str,
                       state_change: ServiceStateChange) -> None:
        """Browser callback (runs in the loop)."""
        if state_change is ServiceStateChange.Removed:
            self._silent.discard(name)
            self._async_forget(name)
        else:
            self._silent.discard(name)
            self._spawn(self._async_resolve(service_type, name))

    def _async_expire_silent_peers(self) -> None:
        """Forget every peer whose SRV record is gone or expired from the cache."""
        assert self._azc is not None
        cache = self._azc.zeroconf.cache
        now = current_time_millis()
        for name in list(self._by_name):
            record = cache.get_by_details(name, _TYPE_SRV, _CLASS_IN)
            if record is None or record.is_expired(now):
                self._silent.add(name)
                self._async_forget(name)
        # A refreshed record of a stale cache entry raises no browser event: notice returning peers here.
        for name in list(self._silent):
            record = cache.get_by_details(name, _TYPE_SRV, _CLASS_IN)
            if record is not None and not record.is_expired(now):
                self._silent.discard(name)
                self._spawn(self._async_resolve(CLUSTER_SERVICE, name))

    def _async_forget(self, name: str) -> None:
        """A service instance went away: report its node removed unless it is still announced under another name."""
        peer = self._by_name.pop(name, None)
        if peer is None:
            return
        if any(p.node_id == peer.node_id for p in self._by_name.values()):
            return
        _LOG.info("peer %s left (%s)", peer.node_id, name)
        self._on_remove(peer.node_id)

    async def _async_resolve(self, service_type: str, name: str) -> None:
        """Fetch a service's SRV/TXT/A records and report the peer if it is of our cluster."""
        assert self._azc is not None
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._azc.zeroconf, RESOLVE_TIMEOUT_MS):
            _LOG.debug("could not resolve %s", name)
            return
        peer = parse_peer(info.properties, info.parsed_addresses(IPVersion.V4Only))
        if peer is None:
            _LOG.debug("ignoring %s: incomplete or malformed TXT records", name)
            return
        if peer.node_id == self.node_id and peer.cluster == self.cluster:
            return  # ourselves
        if peer.cluster != self.cluster:
            _LOG.debug("ignoring node %s of cluster %r", peer.node_id, peer.cluster)
            return
        if info.port is not None and info.port != peer.cluster_port:
            peer = PeerInfo(peer.node_id, peer.cluster, peer.version, peer.addresses, info.port, peer.mqtt_port,
                            peer.mqtts_port)
        old = self._by_name.get(name)
        if old == peer:
            return
        known = any(p.node_id == peer.node_id for p in self._by_name.values())
        self._by_name[name] = peer
        if known:
            self._on_update(peer)
        else:
            _LOG.info("found peer %s at %s:%s", peer.node_id, peer.addresses[0], peer.cluster_port)
            self._on_add(peer)
