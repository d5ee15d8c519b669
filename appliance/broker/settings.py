"""Broker policy knobs with production defaults; the server's config loader fills them from TOML."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.protocol.packets import Connect, Properties

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

    def negotiated_keepalive(self, requested: int) -> int:
        """Keep alive the server will enforce: the client's, capped by max_keepalive when that is set."""
        cap = self.max_keepalive
        if cap and (requested == 0 or requested > cap):
            return cap
        return requested

    def connack_properties(self, assigned: str | None, expiry: int, connect: Connect) -> Properties:
        """What a v5 CONNACK announces: limits, the features switched off, and values that differ from the
        client's request [MQTT-3.2.2.3]."""
        props = Properties(assigned_client_identifier=assigned, receive_maximum=self.receive_maximum,
                           topic_alias_maximum=self.topic_alias_maximum, maximum_packet_size=self.max_packet_size)
        if expiry != (connect.properties.session_expiry_interval or 0):
            props.session_expiry_interval = expiry
        if self.maximum_qos < 2:
            props.maximum_qos = self.maximum_qos
        if not self.retain_available:
            props.retain_available = 0
        if not self.wildcard_subscriptions:
            props.wildcard_subscription_available = 0
        if not self.subscription_identifiers:
            props.subscription_identifier_available = 0
        if not self.shared_subscriptions:
            props.shared_subscription_available = 0
        keepalive = self.negotiated_keepalive(connect.keepalive)
        if keepalive != connect.keepalive:
            props.server_keep_alive = keepalive  # [MQTT-3.2.2-21]
        return props
