"""$SYS topics: periodic broker statistics, retained in memory, published like any message."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from appliance import __version__

if TYPE_CHECKING:
    from .node import Node


def publish_sys(node: Node) -> None:
    """Publish the current figures under $SYS/broker/ (never matched by leading wildcards [MQTT-4.7.2-1])."""
    broker = node.broker
    m = broker.metrics
    figures = {
        "version": f"appliance {__version__}",
        "uptime": f"{int(time.monotonic() - node.started)} seconds",
        "clients/connected": broker.online,
        "clients/total": len(broker.sessions),
        "messages/received": sum(m.messages_in),
        "messages/sent": sum(m.messages_out),
        "messages/dropped": sum(m.drops.values()),
        "subscriptions/count": broker.router.tree.count,
        "retained messages/count": len(broker.router.retained),
        "store/commits": int(node.store.stats().get("commits", 0)),
    }
    for name, value in figures.items():
        broker.publish_sys(f"$SYS/broker/{name}", str(value).encode())
