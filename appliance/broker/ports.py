"""Ports the broker rules call; adapters (store, cluster, deliverylog) implement them as typing.Protocols."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions


@dataclass(slots=True)
class Snapshot:
    """Everything the store recovered at start-up, handed to the broker before listeners open."""

    sessions: dict[str, SessionRecord] = field(default_factory=dict)  # with subscriptions filled in
    queues: dict[str, list[Delivery]] = field(default_factory=dict)  # per client id, ordered by seq
    retained: dict[str, Message] = field(default_factory=dict)  # topic -> message
    incoming_qos2: dict[str, dict[int, Message | None]] = field(default_factory=dict)  # client -> packet id -> msg
    meta: dict[str, str] = field(default_factory=dict)  # node-level key/values (node id, message counter, ...)


class Store(Protocol):
    """Durable state with group commit. Writes are queued in call order and never block the caller.

    `after_commit(cb)` runs `cb` on the event loop once everything queued before it is durable (fsynced).
    A failed commit is fatal: the store calls its `on_fatal` handler and refuses further writes.
    """

    def load(self) -> Snapshot: ...

    def save_session(self, record: SessionRecord) -> None: ...

    def delete_session(self, client_id: str) -> None: ...  # also its subscriptions, queue, incoming QoS2 state

    def save_subscription(self, client_id: str, topic_filter: str, options: SubscriptionOptions) -> None: ...

    def delete_subscription(self, client_id: str, topic_filter: str) -> None: ...

    def enqueue(self, client_id: str, delivery: Delivery) -> None: ...

    def update_delivery(self, client_id: str, seq: int, state: DeliveryState, packet_id: int | None) -> None: ...

    def remove_delivery(self, client_id: str, seq: int) -> None: ...

    def save_retained(self, message: Message) -> None: ...

    def delete_retained(self, topic: str) -> None: ...

    def save_incoming_qos2(self, client_id: str, packet_id: int, message: Message | None) -> None: ...

    def delete_incoming_qos2(self, client_id: str, packet_id: int) -> None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def after_commit(self, callback: Callable[..., Any], *args: Any) -> None: ...

    def stats(self) -> dict[str, float]: ...  # commits, ops, last/avg batch size, commit latency


event_clock = time.monotonic_ns  # the clock of every event: CLOCK_MONOTONIC in ns (the sink adds the wall time)


class EventSink(Protocol):
    """Where the broker reports each message's life (received, committed, routed, delivered, acked, dropped...).

    The five events of a message's hot path are `record_<kind>(msg_id, *values)` callables taking the values
    below positionally; the sink reads event_clock() itself at the call (a C recorder where built: one C call, no
    tuple and no Python frame per event). `emit` takes any kind with the schema's fields as keywords.
    """

    # (msg_id, publisher, topic, qos, retain, payload size, user properties or None, publisher packet id)
    record_received: Callable[[str, str, str, int, bool, int, Any, int | None], None]
    record_committed: Callable[[str], None]  # (msg_id): the message is on disk here
    record_routed: Callable[[str, str, str, int], None]  # (msg_id, subscriber, filter, qos)
    record_delivered: Callable[[str, str, int, bool, int], None]  # (msg_id, subscriber, qos, dup, attempt)
    record_acked: Callable[[str, str, int], None]  # (msg_id, subscriber, qos): PUBACK / PUBCOMP

    def emit(self, kind: str, **fields: Any) -> None: ...


def _discard(*values: Any) -> None:
    """Drop one event."""


class NullEventSink:
    """An EventSink that records nothing (delivery logging off)."""

    record_received = record_committed = record_routed = record_delivered = record_acked = staticmethod(_discard)

    def emit(self, kind: str, **fields: Any) -> None:
        """Discard the event."""


class ClusterPort(Protocol):
    """What the broker needs from the cluster (implemented by the server wiring; None on a single node).

    Acknowledgements stay on the Store's `after_commit`: the wiring's store makes it wait for the acks of every
    forward and replica write queued before it, so the broker's PUBACK / PUBREC / SUBACK flows do not change.
    """

    def publish_refusal(self, message: Message) -> int | None: ...  # reason code when the netsplit policy refuses

    def remote_shared(self, topic: str) -> list[tuple[str, str, dict[str, bool]]]: ...  # shared groups with members
    # on other nodes matching a topic: (group, filter, {client id: its node is reachable}); the router picks one
    # member per group across the cluster

    def qos2_received(self, message: Message) -> None: ...  # a client's QoS2 PUBLISH, its packet id just stored
    # (Store.save_incoming_qos2): the id and the message go to the publisher's replicas now, before any write of
    # the local routing (a local subscriber's replica may be the publisher's: it must apply the id first)

    def route_remote(self, message: Message, shared: list[str]) -> int: ...  # forward to nodes with matching plain
    # subscribers and to the shared-group members the router chose there (and replicate the message as retained
    # when its RETAIN flag is set, an empty payload clearing it); returns sessions reached

    def subscribe_refusal(self) -> int | None: ...  # reason code for every filter of a SUBSCRIBE (netsplit policy)

    def unsubscribe_refusal(self) -> int | None: ...  # reason code for an UNSUBSCRIBE (netsplit policy)

    def session_changed(self, record: SessionRecord, connected: bool = False) -> None: ...  # CONNECT / (un)subscribe

    def session_removed(self, client_id: str) -> None: ...  # a session here ended
