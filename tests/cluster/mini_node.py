"""A minimal cluster node for namespace tests: discovery + peer links, events printed as JSON lines.

python -m tests.cluster.mini_node --cluster lab --node n1 --secret s [--ttl 4] [--no-links] [--seed host:port]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from appliance.cluster import wire
from appliance.cluster.discovery import Discovery, PeerInfo, parse_seeds
from appliance.cluster.peerlinks import PeerLinks

LINK_PORT = 7946


def emit(ev: str, **kw: object) -> None:
    print(json.dumps({"ev": ev, **kw}), flush=True)


class _LogToEvents(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        emit("log", logger=record.name, level=record.levelname, msg=record.getMessage())


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--secret", default="")
    ap.add_argument("--ttl", type=int, default=4)
    ap.add_argument("--requery", type=float, default=None)
    ap.add_argument("--no-links", action="store_true")
    ap.add_argument("--no-mdns", action="store_true")
    ap.add_argument("--mqtts-port", type=int, default=None)
    ap.add_argument("--seed", action="append", default=[])
    args = ap.parse_args()

    handler = _LogToEvents()
    for name in ("appliance.cluster.discovery", "appliance.cluster.link"):
        log = logging.getLogger(name)
        log.setLevel(logging.DEBUG)
        log.addHandler(handler)

    links: PeerLinks | None = None
    if not args.no_links:
        def on_up(peer: str) -> None:
            emit("up", peer=peer)
            # What a real node would share only with authenticated members.
            assert links is not None
            links.async_send(peer, wire.Digest("subs", ((f"secret-of-{args.node}", {args.node: 1}),)))

        links = PeerLinks(args.node, args.cluster, args.secret.encode(), port=LINK_PORT,
                          on_up=on_up, on_down=lambda p, r: emit("down", peer=p, reason=r),
                          on_message=lambda p, m: emit("msg", peer=p, type=type(m).__name__),
                          heartbeat_interval=0.3, timeout=1.5, backoff_initial=0.1, backoff_max=1.0)
        await links.async_start()
        for host, port in parse_seeds(args.seed, LINK_PORT):
            emit("seed", host=host, port=port)
            links.async_add_seed(host, port)

    def on_add(p: PeerInfo) -> None:
        emit("found", peer=p.node_id, addr=p.addresses[0], port=p.cluster_port)
        if links is not None:
            links.async_add_peer(p.node_id, p.addresses[0], p.cluster_port)

    def on_update(p: PeerInfo) -> None:
        emit("updated", peer=p.node_id, addr=p.addresses[0])
        if links is not None:
            links.async_add_peer(p.node_id, p.addresses[0], p.cluster_port)

    def on_remove(node_id: str) -> None:
        emit("lost", peer=node_id)

    disco = None
    if not args.no_mdns:
        disco = Discovery(cluster=args.cluster, node_id=args.node, cluster_port=LINK_PORT, mqtt_port=1883,
                          mqtts_port=args.mqtts_port,
                          on_add=on_add, on_update=on_update, on_remove=on_remove, ttl=args.ttl,
                          requery_interval=args.requery)
        await disco.async_start()
    emit("ready", node=args.node)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    if disco is not None:
        await disco.async_stop()
    if links is not None:
        await links.async_stop()
    emit("stopped")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
