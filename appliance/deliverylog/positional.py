"""The hot events' positional layouts: DeliveryLog's fast methods queue a tuple, the writer turns it into fields."""

from __future__ import annotations

from typing import Any

# kind -> the schema field of each tuple position; `received` also carries the user properties, from which the
# writer takes publisher_seq (position USER of RECEIVED).
LAYOUTS: dict[str, tuple[str, ...]] = {
    "received": ("msg_id", "publisher", "topic", "qos", "retain", "payload_size", "", "publisher_packet_id"),
    "committed": ("msg_id",),
    "routed": ("msg_id", "subscriber", "filter", "qos"),
    "delivered": ("msg_id", "subscriber", "qos", "dup", "attempt"),
    "acked": ("msg_id", "subscriber", "qos"),
}
USER = 6  # position of the user properties in a `received` tuple


def publisher_seq(user_properties: Any, name: str) -> int | None:
    """The publisher sequence number: the first user property called `name`, when it is a 64-bit integer."""
    for key, value in user_properties or ():
        if key == name:
            try:
                seq = int(value)
            except (TypeError, ValueError):
                return None
            return seq if -(2**63) <= seq < 2**63 else None
    return None


def fields_of(kind: str, values: tuple[Any, ...], seq_property: str) -> dict[str, Any]:
    """The schema fields of a positional event (None values and the empty publisher left out)."""
    layout = LAYOUTS[kind]
    fields = {name: value for name, value in zip(layout, values, strict=True) if name and value is not None}
    if kind == "received":
        if not fields.get("publisher"):
            fields.pop("publisher", None)
        seq = publisher_seq(values[USER], seq_property)
        if seq is not None:
            fields["publisher_seq"] = seq
    return fields


def plain(kind: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`values` with builtin types only (a subclass of int, str or bool made plain), for marshal."""
    out: list[Any] = []
    for i, value in enumerate(values):
        if kind == "received" and i == USER:
            out.append([(str(k), str(v)) for k, v in value] if value else None)
        elif value is None or type(value) in (str, int, bool):
            out.append(value)
        elif isinstance(value, bool):
            out.append(bool(value))
        elif isinstance(value, int):
            out.append(int(value))
        else:
            out.append(str(value))
    return tuple(out)
