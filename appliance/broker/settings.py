"""Broker policy knobs with production defaults; the server's config loader fills them from TOML."""

from __future__ import annotations

from dataclasses import dataclass

NEVER_EXPIRES = 0xFFFFFFFF
QUEUE_POLICIES = ("drop-oldest", "drop-new", "refuse")


@dataclass(slots=True)
class BrokerSettings:
    """Limits and features of one broker node; every limit is counted in metrics when it bites."""

    node_id: str = "node"
    allow_anonymous: bool = True
    max_connections: int = 10_000
    max_packet_size: int = 1_048_576  # bytes, both directions [MQTT-3.1.2-24]
    receive_maximum: int = 1024  # inbound QoS>0 window we announce [MQTT-3.2.2.3.3]
    max_inflight: int = 1024  # outbound window per session (the client's Receive Maximum may lower it); a message that
    # waits for a slot costs one more durable write (its packet id) than one sent at once
    max_queued_messages: int = 100_000  # per session, waiting + inflight
    queue_full_policy: str = "drop-oldest"
    queue_qos0_offline: bool = False
    max_keepalive: int = 0  # 0: no cap; otherwise Server Keep Alive is imposed [MQTT-3.2.2-21]
    max_session_expiry: int = NEVER_EXPIRES
    v311_persistent_session_expiry: int = NEVER_EXPIRES  # clean_session=0 sessions of 3.1.1 clients
    retain_available: bool = True
    wildcard_subscriptions: bool = True
    shared_subscriptions: bool = True
    subscription_identifiers: bool = True
    topic_alias_maximum: int = 64
    maximum_qos: int = 2
    publisher_seq_property: str = "seq"  # user property carrying the publisher's sequence number (logs)
