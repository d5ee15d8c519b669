"""Delivery logs: schema-v1 event segments written off the broker's hot path, and their upload."""

from .identity import Identity, clock_sync_probe, read_boot_id
from .schema import FIELDS, KINDS, SCHEMA_VERSION
from .segments import read_segment, read_segments
from .sink import DeliveryLog
from .writer import DeliveryLogError, Limits

__all__ = [
    "FIELDS",
    "KINDS",
    "SCHEMA_VERSION",
    "DeliveryLog",
    "DeliveryLogError",
    "Identity",
    "Limits",
    "clock_sync_probe",
    "read_boot_id",
    "read_segment",
    "read_segments",
]
