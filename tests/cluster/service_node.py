"""A ClusterService node for namespace tests, driven by JSON commands on stdin, reporting JSON events on stdout.

python -m tests.cluster.service_node --cluster lab --node n1 --secret s
stdin:  {"op": "put"|"delete", "space": "subs", "key": "k", "value": "v"}  |  {"op": "dump"}
stdout: {"ev": "up"|"down", "peer": ...}  {"ev": "state", "space": ..., "digest": ..., "live": {...}}
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import signal
import sys

from appliance.cluster import dvv
from appliance.cluster.service import ClusterCallbacks, ClusterConfig, ClusterService


def emit(ev: str, **kw: object) -> None:
    print(json.dumps({"ev": ev, **kw}), flush=True)


def dump(svc: ClusterService) -> None:
    for name, space in sorted(svc.spaces.items()):
        clocks = space.clocks()
        h = hashlib.sha256()
        for key in sorted(clocks):
            h.update(key.encode() + b"\0" + dvv.encode(clocks[key]))
        live = {k: v.decode(errors="replace") for k, v in sorted(space.items().items())}
        emit("state", space=name, digest=h.hexdigest(), keys=len(clocks), live=live)


async def read_commands(svc: ClusterService, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        cmd = json.loads(line)
        if cmd["op"] == "put":
            svc.put(cmd["space"], cmd["key"], cmd["value"].encode())
        elif cmd["op"] == "delete":
            svc.delete(cmd["space"], cmd["key"])
        elif cmd["op"] == "dump":
            dump(svc)
        elif cmd["op"] == "status":
            emit("status", rows=svc.status())
        emit("done", op=cmd["op"])
    stop.set()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--secret", required=True)
    args = ap.parse_args()
    cfg = ClusterConfig(node_id=args.node, cluster=args.cluster, secret=args.secret.encode(), mdns_ttl=4,
                        heartbeat_interval=0.3, failure_timeout=1.5, anti_entropy_interval=1.0, gc_interval=1.0)
    cb = ClusterCallbacks(on_member=lambda p, up: emit("up" if up else "down", peer=p))
    svc = ClusterService(cfg, cb)
    await svc.async_start()
    emit("ready", node=args.node)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    reader = asyncio.get_running_loop().create_task(read_commands(svc, stop))
    await stop.wait()
    reader.cancel()
    await svc.async_stop()


if __name__ == "__main__":
    asyncio.run(main())
