"""Contract: cloud_spark's own StructType for delivery-log v1 matches schema/deliverylog.v1.json exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
from pyspark.sql import types as T

from cloud_spark import schema

pytestmark = pytest.mark.spark
CONTRACT = Path(__file__).resolve().parents[2] / "schema" / "deliverylog.v1.json"
TYPES = {"string": T.StringType(), "int": T.IntegerType(), "long": T.LongType(), "boolean": T.BooleanType()}


def test_v1_fields_types_and_nullability_match_the_contract() -> None:
    doc = json.loads(CONTRACT.read_text())
    expected = [(f["name"], TYPES[f["type"]], f["nullable"]) for f in doc["fields"]]
    actual = [(f.name, f.dataType, f.nullable) for f in schema.VERSIONS[doc["schema_version"]].schema.fields]
    assert actual == expected


def test_kinds_match_the_contract_enum() -> None:
    doc = json.loads(CONTRACT.read_text())
    (kind,) = [f for f in doc["fields"] if f["name"] == "kind"]
    assert list(schema.VERSIONS[1].kinds) == kind["enum"]
    assert set(schema.CLIENT_KINDS) <= set(kind["enum"])


def test_versions_must_not_change_a_field_type() -> None:
    bad = T.StructType([T.StructField("event_id", T.LongType(), False)])
    with pytest.raises(ValueError, match="event_id"):
        schema.parse_schema({1: schema.VERSIONS[1], 2: schema.VersionSpec(2, bad)})
