"""Read the whole durable state into a Snapshot in a handful of ordered scans."""

from __future__ import annotations

import sqlite3

from appliance.broker.model import Delivery, DeliveryState, Message
from appliance.broker.ports import Snapshot
from appliance.protocol.packets import Properties

from .rows import (
    message_from_row,
    properties_from_text,
    session_from_row,
    subscription_from_row,
    subscription_ids_from_text,
)


def load_snapshot(conn: sqlite3.Connection) -> Snapshot:
    """Sessions (with subscriptions), queues by seq, retained, incoming QoS2 and meta, read in one transaction.

    A session's next_seq is raised above its highest queued seq, so the broker need not save it on every enqueue.
    Loaded messages with equal properties share one Properties object: treat them as immutable, like the Message.
    """
    snap = Snapshot()
    conn.execute("BEGIN")
    try:
        for row in conn.execute("SELECT * FROM sessions"):
            record = session_from_row(row)
            snap.sessions[record.client_id] = record
        for row in conn.execute("SELECT * FROM subscriptions ORDER BY client_id, topic_filter"):
            session = snap.sessions.get(row[0])
            if session is not None:
                session.subscriptions[row[1]] = subscription_from_row(row)
        messages: dict[str, Message] = {}  # one Message object per msg_id across all queues (fan-out)
        properties: dict[str | None, Properties] = {}  # one Properties object per distinct serialised form
        sub_ids: dict[str, tuple[int, ...]] = {}
        states = {int(state): state for state in DeliveryState}
        current_client: str | None = None
        current: list[Delivery] = []
        append = current.append
        for row in conn.execute("SELECT * FROM queue ORDER BY client_id, seq"):
            if row[0] != current_client:
                current_client = row[0]
                current = snap.queues.setdefault(row[0], [])
                append = current.append
            message = messages.get(row[2])
            if message is None:
                props = properties.get(row[10])
                if props is None:
                    props = properties[row[10]] = properties_from_text(row[10])
                message = messages[row[2]] = Message(
                    row[2], row[3], row[4], row[5], bool(row[6]), row[7], row[8], row[9], props
                )
            ids_text = row[13]
            if ids_text is None:
                ids: list[int] = []
            else:
                cached = sub_ids.get(ids_text)
                if cached is None:
                    cached = sub_ids[ids_text] = tuple(subscription_ids_from_text(ids_text))
                ids = list(cached)
            append(Delivery(row[1], message, row[11], bool(row[12]), ids, row[14], states[row[15]], row[16]))
        for client_id, deliveries in snap.queues.items():
            session = snap.sessions.get(client_id)
            if session is not None and deliveries and session.next_seq <= deliveries[-1].seq:
                session.next_seq = deliveries[-1].seq + 1
        for row in conn.execute("SELECT * FROM retained"):
            snap.retained[row[0]] = message_from_row((row[1], row[0], *row[2:]))
        for row in conn.execute("SELECT * FROM incoming_qos2 ORDER BY client_id, packet_id"):
            held = snap.incoming_qos2.setdefault(row[0], {})
            held[row[1]] = None if row[2] is None else message_from_row(row, 2)
        for key, value in conn.execute("SELECT key, value FROM meta"):
            snap.meta[key] = value
    finally:
        conn.execute("COMMIT")
    return snap
