"""Shared builders for the store tests: records with every field set, and a blocking flush."""

from __future__ import annotations

import threading

from appliance.broker.model import Delivery, DeliveryState, Message, SessionRecord, SubscriptionOptions
from appliance.protocol.packets import Properties, Will
from appliance.store import SqliteStore


def rich_properties(tag: str = "x") -> Properties:
    """Properties with every kind of field a publication can carry set."""
    return Properties(
        payload_format_indicator=1,
        message_expiry_interval=3600,
        content_type=f"text/{tag}",
        response_topic=f"reply/{tag}",
        correlation_data=b"\x00\xffcorr" + tag.encode(),
        user_properties=[("k", "v1"), ("k", "v2"), ("ünï", "çødé")],
    )


def message(msg_id: str, topic: str = "a/b", *, payload: bytes = b"hello", qos: int = 1, rich: bool = False) -> Message:
    """A message; `rich` sets expiry and non-default properties."""
    return Message(
        msg_id=msg_id,
        topic=topic,
        payload=payload,
        qos=qos,
        retain=False,
        publisher="pub-1",
        created=1_700_000_000.25,
        expiry_at=1_700_003_600.5 if rich else None,
        properties=rich_properties(msg_id) if rich else Properties(),
    )


def delivery(seq: int, msg: Message, **kw) -> Delivery:
    """A queued delivery of `msg`."""
    return Delivery(
        seq=seq,
        message=msg,
        qos=kw.get("qos", msg.qos),
        retain=kw.get("retain", False),
        subscription_ids=kw.get("subscription_ids", []),
        packet_id=kw.get("packet_id"),
        state=kw.get("state", DeliveryState.QUEUED),
        attempts=kw.get("attempts", 0),
    )


def session(client_id: str, **kw) -> SessionRecord:
    """A session record with a pending will."""
    return SessionRecord(
        client_id=client_id,
        protocol_version=kw.get("protocol_version", 5),
        expiry_interval=kw.get("expiry_interval", 0xFFFFFFFF),
        disconnected_at=kw.get("disconnected_at", 1_700_000_100.0),
        will=kw.get("will", Will("will/" + client_id, b"gone\x00", 1, True, Properties(will_delay_interval=30))),
        will_due_at=kw.get("will_due_at", 1_700_000_130.0),
        username=kw.get("username", "user-" + client_id),
        next_seq=kw.get("next_seq", 1),
    )


def options(qos: int = 1, **kw) -> SubscriptionOptions:
    """Subscription options."""
    return SubscriptionOptions(qos=qos, **kw)


def flush(store: SqliteStore, timeout: float = 60.0) -> None:
    """Block until everything written so far is committed (store started without a loop)."""
    done = threading.Event()
    store.after_commit(done.set)
    assert done.wait(timeout), "after_commit callback never ran"
