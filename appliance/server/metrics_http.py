"""Prometheus text exposition (and JSON status) over a minimal HTTP/1.0 endpoint."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from .config import parse_hostport

if TYPE_CHECKING:
    from .node import Node


def render_metrics(node: Node) -> str:
    """All node metrics in Prometheus text format 0.0.4."""
    broker = node.broker
    m = broker.metrics
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP appliance_{name} {help_text}")
        lines.append(f"# TYPE appliance_{name} {kind}")
        for labels, value in samples:
            lines.append(f"appliance_{name}{labels} {value:g}")

    metric("connections", "gauge", "Connected clients.", [("", broker.online)])
    metric("sessions", "gauge", "Sessions held (online and offline).", [("", len(broker.sessions))])
    metric("subscriptions", "gauge", "Subscriptions in the topic tree.", [("", broker.router.tree.count)])
    metric("retained_messages", "gauge", "Retained messages.", [("", len(broker.router.retained))])
    depth = sum(s.queued_count() for s in broker.sessions.values())
    metric("queue_depth", "gauge", "Messages queued or inflight over all sessions.", [("", depth)])
    metric("messages_received_total", "counter", "PUBLISH packets received by QoS.",
           [(f'{{qos="{q}"}}', m.messages_in[q]) for q in range(3)])
    metric("messages_sent_total", "counter", "Messages delivered (QoS0 sent, QoS1/2 acknowledged) by QoS.",
           [(f'{{qos="{q}"}}', m.messages_out[q]) for q in range(3)])
    metric("bytes_received_total", "counter", "Bytes received from clients.", [("", m.bytes_in)])
    metric("bytes_sent_total", "counter", "PUBLISH bytes sent to clients.", [("", m.bytes_out)])
    metric("connects_total", "counter", "Accepted CONNECTs.", [("", m.connects)])
    metric("connects_refused_total", "counter", "Refused CONNECTs by reason.",
           [(f'{{reason="{r}"}}', n) for r, n in sorted(m.connects_refused.items())])
    metric("takeovers_total", "counter", "Session takeovers.", [("", m.takeovers)])
    metric("drops_total", "counter", "Messages dropped by reason.",
           [(f'{{reason="{r}"}}', n) for r, n in sorted(m.drops.items())])
    metric("wills_published_total", "counter", "Will messages published.", [("", m.wills_published)])
    metric("sessions_expired_total", "counter", "Sessions ended by expiry.", [("", m.sessions_expired)])
    stats = node.store.stats()
    metric("store_commits_total", "counter", "Group commits (each one fsync).", [("", stats.get("commits", 0))])
    metric("store_ops_total", "counter", "Store operations committed.", [("", stats.get("ops", 0))])
    metric("store_ops_elided_total", "counter", "Store operations never written: their row was removed in the same "
           "commit (e.g. a queue entry acked before it reached the disk).", [("", stats.get("ops_elided", 0))])
    metric("store_commit_batch_size", "gauge", "Operations per commit.",
           [(f'{{stat="{k}"}}', stats.get(f"batch_{k}", 0)) for k in ("last", "mean", "max")])
    metric("store_commit_latency_ms", "gauge", "Commit latency in milliseconds.",
           [(f'{{stat="{k}"}}', stats.get(f"commit_latency_{k}_ms", 0)) for k in ("mean", "p99", "max")])
    metric("store_fsyncs_per_second", "gauge", "Recent commit (fsync) rate.", [("", stats.get("fsyncs_per_s", 0))])
    metric("store_pending_ops", "gauge", "Operations waiting for the writer.", [("", stats.get("pending", 0))])
    return "\n".join(lines) + "\n"


def status_json(node: Node) -> dict[str, Any]:
    """Node status as JSON-able data (used by `appliance cluster show` and tests)."""
    return {
        "node": node.config.node_name,
        "listeners": node.addresses(),
        "clients": node.broker.online,
        "sessions": len(node.broker.sessions),
        "store": node.store.stats(),
    }


async def async_start_metrics(node: Node, bind: str) -> asyncio.AbstractServer:
    """Serve GET /metrics (Prometheus), GET /status and GET /cluster (JSON)."""
    host, port = parse_hostport(bind, "metrics.http")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)).strip():
                pass
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            if path == "/metrics":
                body, ctype, status = render_metrics(node).encode(), "text/plain; version=0.0.4", "200 OK"
            elif path == "/status":
                body, ctype, status = json.dumps(status_json(node)).encode(), "application/json", "200 OK"
            elif path == "/cluster":
                data = node.cluster.status() if node.cluster is not None else {"node": node.config.node_name,
                                                                                "enabled": False, "members": []}
                body, ctype, status = json.dumps(data).encode(), "application/json", "200 OK"
            else:
                body, ctype, status = b"not found\n", "text/plain", "404 Not Found"
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):  # ValueError: a line longer than the stream limit
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_address=True)
