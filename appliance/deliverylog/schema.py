"""The appliance side's copy of delivery-log schema v1: field names, types, nullability and event kinds."""

from __future__ import annotations

from typing import Any, cast

SCHEMA_VERSION = 1

# name -> (schema type, nullable). Order is the canonical column order of schema/deliverylog.v1.json.
FIELDS: dict[str, tuple[str, bool]] = {
    "event_id": ("string", False),
    "schema_version": ("int", False),
    "source": ("string", False),
    "fleet": ("string", False),
    "device": ("string", False),
    "node": ("string", False),
    "firmware": ("string", False),
    "boot_id": ("string", False),
    "ts_wall_us": ("long", False),
    "ts_mono_us": ("long", False),
    "clock_synced": ("boolean", False),
    "kind": ("string", False),
    "msg_id": ("string", True),
    "publisher": ("string", True),
    "publisher_packet_id": ("int", True),
    "publisher_seq": ("long", True),
    "topic": ("string", True),
    "qos": ("int", True),
    "retain": ("boolean", True),
    "payload_size": ("int", True),
    "subscriber": ("string", True),
    "filter": ("string", True),
    "peer_node": ("string", True),
    "reason": ("string", True),
    "dup": ("boolean", True),
    "attempt": ("int", True),
}

KINDS: tuple[str, ...] = (
    "received",
    "committed",
    "routed",
    "forwarded",
    "forward_acked",
    "replicated",
    "queued_offline",
    "delivered",
    "acked",
    "released",
    "expired",
    "dropped",
    "migrated",
    "takeover",
    "node_start",
    "node_stop",
    "peer_up",
    "peer_down",
    "log_evicted",
    "client_published",
    "client_acked",
    "client_received",
)
KIND_SET = frozenset(KINDS)

SOURCES = ("broker", "client")

# Fields the writer fills in itself; a caller of emit() passes only EMIT_FIELDS.
IDENTITY_FIELDS = ("schema_version", "source", "fleet", "device", "node", "firmware", "boot_id")
WRITER_FIELDS = ("event_id", "ts_wall_us", "ts_mono_us", "clock_synced", "kind")
EMIT_FIELDS = frozenset(name for name, (_, nullable) in FIELDS.items() if nullable)

# Nullable fields may be absent from a JSON line; absent means null (Spark's JSON reader with a schema agrees).
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "long": (int,),
    "boolean": (bool,),
}
_INT_RANGE: dict[str, tuple[int, int]] = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def field_problem(name: str, value: Any) -> str | None:
    """Why `value` is not valid for field `name`, or None when it is."""
    spec = FIELDS.get(name)
    if spec is None:
        return f"unknown field {name!r}"
    type_name, nullable = spec
    if value is None:
        return None if nullable else f"field {name!r} must not be null"
    if type_name in _INT_RANGE and isinstance(value, bool):
        return f"field {name!r} must be {type_name}, got bool"
    if not isinstance(value, _PY_TYPES[type_name]):
        return f"field {name!r} must be {type_name}, got {type(value).__name__}"
    if type_name in _INT_RANGE:
        lo, hi = _INT_RANGE[type_name]
        if not lo <= cast(int, value) <= hi:
            return f"field {name!r} out of {type_name} range: {value}"
    return None


def record_problems(record: dict[str, Any]) -> list[str]:
    """Every way `record` (one decoded JSON line) breaks schema v1; empty when it conforms."""
    problems = [p for name, value in record.items() if (p := field_problem(name, value))]
    required = (name for name, (_, nullable) in FIELDS.items() if not nullable)
    problems += [f"missing field {name!r}" for name in required if name not in record]
    if record.get("schema_version") not in (None, SCHEMA_VERSION):
        problems.append(f"schema_version {record.get('schema_version')!r} is not {SCHEMA_VERSION}")
    if "kind" in record and record["kind"] not in KIND_SET:
        problems.append(f"unknown kind {record['kind']!r}")
    if "source" in record and record["source"] not in SOURCES:
        problems.append(f"unknown source {record['source']!r}")
    return problems


def normalized(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with every schema field present (absent nullable fields as None), in canonical order."""
    return {name: record.get(name) for name in FIELDS}
