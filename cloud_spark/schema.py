"""cloud_spark's own copy of the delivery-log record schema, one StructType per accepted schema version."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import types as T

BROKER_KINDS = (
    "received", "committed", "routed", "forwarded", "forward_acked", "replicated", "queued_offline",
    "delivered", "acked", "released", "expired", "dropped", "migrated", "takeover",
    "node_start", "node_stop", "peer_up", "peer_down", "log_evicted",
)
CLIENT_KINDS = ("client_published", "client_acked", "client_received")
KINDS = BROKER_KINDS + CLIENT_KINDS
SOURCES = ("broker", "client")


def _f(name: str, dtype: T.DataType, nullable: bool) -> T.StructField:
    return T.StructField(name, dtype, nullable)


S, INT, L, B = T.StringType(), T.IntegerType(), T.LongType(), T.BooleanType()

V1 = T.StructType([
    _f("event_id", S, False), _f("schema_version", INT, False), _f("source", S, False),
    _f("fleet", S, False), _f("device", S, False), _f("node", S, False), _f("firmware", S, False),
    _f("boot_id", S, False), _f("ts_wall_us", L, False), _f("ts_mono_us", L, False),
    _f("clock_synced", B, False), _f("kind", S, False),
    _f("msg_id", S, True), _f("publisher", S, True), _f("publisher_packet_id", INT, True),
    _f("publisher_seq", L, True), _f("topic", S, True), _f("qos", INT, True), _f("retain", B, True),
    _f("payload_size", INT, True), _f("subscriber", S, True), _f("filter", S, True),
    _f("peer_node", S, True), _f("reason", S, True), _f("dup", B, True), _f("attempt", INT, True),
])


@dataclass(frozen=True)
class VersionSpec:
    """How records of one schema version are parsed and which of their fields are required."""

    version: int
    schema: T.StructType
    kinds: tuple[str, ...] = KINDS
    renames: Mapping[str, str] = field(default_factory=dict)  # this version's name -> canonical name

    @property
    def required(self) -> tuple[str, ...]:
        """Names of this version's non-nullable fields."""
        return tuple(f.name for f in self.schema.fields if not f.nullable)


# Every version cloud_spark accepts. A new producer version is one new entry (its StructType, and renames when a field
# was renamed); fields only ever get added, so older records simply have nulls in newer columns.
VERSIONS: dict[int, VersionSpec] = {1: VersionSpec(1, V1)}

# The analysis works on this one shape whatever version a record came in: the newest version's fields.
CANONICAL = V1


def parse_schema(versions: Mapping[int, VersionSpec]) -> T.StructType:
    """The union of all versions' fields (all nullable), used to parse any record once."""
    fields: dict[str, T.DataType] = {}
    for spec in versions.values():
        for f in spec.schema.fields:
            known = fields.setdefault(f.name, f.dataType)
            if known != f.dataType:
                raise ValueError(f"field {f.name!r} changes type across versions: {known} vs {f.dataType}")
    return T.StructType([T.StructField(n, t, True) for n, t in fields.items()])


def canonical_schema(versions: Mapping[int, VersionSpec]) -> T.StructType:
    """CANONICAL plus any field a registered version adds beyond it, all nullable except the v1 required ones."""
    names = {f.name for f in CANONICAL.fields}
    extra = [T.StructField(n, t, True) for n, t in ((f.name, f.dataType) for f in parse_schema(versions).fields)
             if n not in names and n not in {r for s in versions.values() for r in s.renames}]
    return T.StructType(list(CANONICAL.fields) + extra)
