"""Map broker records to SQLite row values and back (Properties and Will as compact JSON, bytes as base64)."""

from __future__ import annotations

import base64
import json
import operator
from dataclasses import fields
from typing import Any

from appliance.broker.model import Message, SessionRecord, SubscriptionOptions
from appliance.protocol.packets import NO_PROPERTIES, Properties, Will

_PROPERTY_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Properties))
_BYTES_PROPERTIES = frozenset({"correlation_data", "authentication_data"})
_all_properties = operator.attrgetter(*_PROPERTY_NAMES)
_DEFAULT_VALUES: tuple[Any, ...] = _all_properties(Properties())
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# Row layouts (column order matches the INSERT statements in writer.py and the SELECTs in loader.py).
MessageRow = tuple[str, str, bytes, int, int, str, float, float | None, str | None]


def properties_to_text(props: Properties) -> str | None:
    """Serialise the non-default fields of `props` as compact JSON; None when every field is default."""
    if props is NO_PROPERTIES:
        return None
    values = _all_properties(props)
    if values == _DEFAULT_VALUES:
        return None
    out: dict[str, Any] = {}
    for name, value, default in zip(_PROPERTY_NAMES, values, _DEFAULT_VALUES, strict=True):
        if value == default:
            continue
        if name in _BYTES_PROPERTIES:
            out[name] = base64.b64encode(value).decode("ascii")
        elif name == "user_properties":
            out[name] = [list(pair) for pair in value]  # order preserved [MQTT-3.3.2-18]
        else:
            out[name] = value
    return _encode(out)


def properties_from_text(text: str | None) -> Properties:
    """Rebuild Properties from properties_to_text output (None gives all defaults)."""
    if not text:
        return Properties()
    data: dict[str, Any] = json.loads(text)
    for name in _BYTES_PROPERTIES & data.keys():
        data[name] = base64.b64decode(data[name])
    if "user_properties" in data:
        data["user_properties"] = [(k, v) for k, v in data["user_properties"]]
    return Properties(**data)


def will_to_text(will: Will | None) -> str | None:
    """Serialise a pending Will as JSON (None stays None)."""
    if will is None:
        return None
    return _encode(
        {
            "topic": will.topic,
            "payload": base64.b64encode(will.payload).decode("ascii"),
            "qos": will.qos,
            "retain": will.retain,
            "properties": properties_to_text(will.properties),
        }
    )


def will_from_text(text: str | None) -> Will | None:
    """Rebuild a Will from will_to_text output."""
    if not text:
        return None
    data = json.loads(text)
    return Will(
        topic=data["topic"],
        payload=base64.b64decode(data["payload"]),
        qos=data["qos"],
        retain=data["retain"],
        properties=properties_from_text(data["properties"]),
    )


def message_row(message: Message, texts: dict[int, str | None] | None = None) -> MessageRow:
    """The message columns shared by queue, retained and incoming_qos2 rows.

    `texts` caches the properties text per Properties object across calls (a fan-out shares one message's).
    """
    props = message.properties
    if props is NO_PROPERTIES or texts is None:
        text = properties_to_text(props)
    elif id(props) in texts:
        text = texts[id(props)]
    else:
        text = texts[id(props)] = properties_to_text(props)
    return (
        message.msg_id,
        message.topic,
        message.payload,
        message.qos,
        int(message.retain),
        message.publisher,
        message.created,
        message.expiry_at,
        text,
    )


def message_from_row(row: tuple[Any, ...] | list[Any], start: int = 0) -> Message:
    """Rebuild a Message from the nine message columns beginning at `start`."""
    r = row
    i = start
    return Message(
        msg_id=r[i],
        topic=r[i + 1],
        payload=bytes(r[i + 2]),
        qos=r[i + 3],
        retain=bool(r[i + 4]),
        publisher=r[i + 5],
        created=r[i + 6],
        expiry_at=r[i + 7],
        properties=properties_from_text(r[i + 8]),
    )


def session_row(record: SessionRecord) -> tuple[Any, ...]:
    """Column values of a sessions row (subscriptions are stored separately)."""
    return (
        record.client_id,
        record.protocol_version,
        record.expiry_interval,
        record.disconnected_at,
        will_to_text(record.will),
        record.will_due_at,
        record.username,
        record.next_seq,
    )


def session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    """Rebuild a SessionRecord (without subscriptions) from a sessions row."""
    return SessionRecord(
        client_id=row[0],
        protocol_version=row[1],
        expiry_interval=row[2],
        disconnected_at=row[3],
        will=will_from_text(row[4]),
        will_due_at=row[5],
        username=row[6],
        next_seq=row[7],
    )


def subscription_row(client_id: str, topic_filter: str, options: SubscriptionOptions) -> tuple[Any, ...]:
    """Column values of a subscriptions row."""
    return (
        client_id,
        topic_filter,
        options.qos,
        int(options.no_local),
        int(options.retain_as_published),
        options.retain_handling,
        options.subscription_id,
    )


def subscription_from_row(row: tuple[Any, ...]) -> SubscriptionOptions:
    """Rebuild SubscriptionOptions from columns 2.. of a subscriptions row."""
    return SubscriptionOptions(
        qos=row[2],
        no_local=bool(row[3]),
        retain_as_published=bool(row[4]),
        retain_handling=row[5],
        subscription_id=row[6],
    )


def subscription_ids_to_text(ids: list[int] | tuple[int, ...]) -> str | None:
    """Comma-separated subscription identifiers, None when there are none."""
    return ",".join(map(str, ids)) if ids else None


def subscription_ids_from_text(text: str | None) -> list[int]:
    """Inverse of subscription_ids_to_text."""
    return [int(x) for x in text.split(",")] if text else []
