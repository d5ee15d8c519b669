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


def _received(v: tuple[Any, ...], seq_property: str) -> dict[str, Any]:
    fields = {"msg_id": v[0], "topic": v[2], "qos": v[3], "retain": v[4], "payload_size": v[5]}
    if v[1]:
        fields["publisher"] = v[1]
    if v[7] is not None:
        fields["publisher_packet_id"] = v[7]
    if v[USER]:
        seq = publisher_seq(v[USER], seq_property)
        if seq is not None:
            fields["publisher_seq"] = seq
    return fields


# kind -> (values, seq property) -> fields; one literal dict per kind (these values are never None)
_BUILD: dict[str, Any] = {
    "received": _received,
    "committed": lambda v, _s: {"msg_id": v[0]},
    "routed": lambda v, _s: {"msg_id": v[0], "subscriber": v[1], "filter": v[2], "qos": v[3]},
    "delivered": lambda v, _s: {"msg_id": v[0], "subscriber": v[1], "qos": v[2], "dup": v[3], "attempt": v[4]},
    "acked": lambda v, _s: {"msg_id": v[0], "subscriber": v[1], "qos": v[2]},
}


def fields_of(kind: str, values: tuple[Any, ...], seq_property: str) -> dict[str, Any]:
    """The schema fields of a positional event (an empty publisher and absent values left out)."""
    if len(values) != len(LAYOUTS[kind]):
        raise ValueError(f"{kind}: {len(values)} values for a layout of {len(LAYOUTS[kind])}")
    return _BUILD[kind](values, seq_property)


def plain(kind: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`values` with builtin types only (an int subclass made int, anything else its text), for marshal."""
    out: list[Any] = []
    for i, value in enumerate(values):
        if kind == "received" and i == USER:
            out.append([(str(k), str(v)) for k, v in value] if value else None)
        elif value is None or type(value) in (str, int, bool):
            out.append(value)
        elif isinstance(value, int):
            out.append(int(value))
        else:
            out.append(str(value))
    return tuple(out)
