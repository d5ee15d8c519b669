"""Pins appliance/deliverylog/schema.py to the committed schema/deliverylog.v1.json (the contract with cloud_spark)."""

import json
import pathlib

from appliance.deliverylog import schema

SCHEMA_FILE = pathlib.Path(__file__).resolve().parents[2] / "schema" / "deliverylog.v1.json"


def _doc():
    return json.loads(SCHEMA_FILE.read_text())


def test_version_matches():
    assert _doc()["schema_version"] == schema.SCHEMA_VERSION


def test_fields_names_order_types_and_nullability_match():
    committed = [(f["name"], f["type"], f["nullable"]) for f in _doc()["fields"]]
    ours = [(name, type_name, nullable) for name, (type_name, nullable) in schema.FIELDS.items()]
    assert ours == committed


def test_event_kinds_match():
    (kind_field,) = [f for f in _doc()["fields"] if f["name"] == "kind"]
    assert list(schema.KINDS) == kind_field["enum"]


def test_emit_fields_are_exactly_the_nullable_ones():
    nullable = {f["name"] for f in _doc()["fields"] if f["nullable"]}
    assert nullable == schema.EMIT_FIELDS
    required = {f["name"] for f in _doc()["fields"] if not f["nullable"]}
    assert set(schema.IDENTITY_FIELDS) | set(schema.WRITER_FIELDS) == required


def test_record_problems_catches_type_and_kind_errors():
    good = {
        "event_id": "n:b:0", "schema_version": 1, "source": "broker", "fleet": "f", "device": "d", "node": "n",
        "firmware": "1", "boot_id": "b", "ts_wall_us": 1, "ts_mono_us": 2, "clock_synced": True, "kind": "acked",
    }
    assert schema.record_problems(good) == []
    assert schema.record_problems({**good, "qos": "1"}) == ["field 'qos' must be int, got str"]
    assert schema.record_problems({**good, "qos": True}) == ["field 'qos' must be int, got bool"]
    assert schema.record_problems({**good, "kind": "teleported"}) == ["unknown kind 'teleported'"]
    too_big = schema.record_problems({**good, "payload_size": 2**31})
    assert too_big == ["field 'payload_size' out of int range: 2147483648"]
    missing = dict(good)
    del missing["boot_id"]
    assert schema.record_problems(missing) == ["missing field 'boot_id'"]


def test_parquet_schema_matches_the_committed_types_and_nullability():
    from appliance.deliverylog.columnar import arrow_schema

    arrow_names = {"string": "string", "int": "int32", "long": "int64", "boolean": "bool"}
    committed = [(f["name"], arrow_names[f["type"]], f["nullable"]) for f in _doc()["fields"]]
    assert [(f.name, str(f.type), f.nullable) for f in arrow_schema()] == committed
