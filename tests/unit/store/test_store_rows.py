"""Properties and Will survive their compact JSON form with every field set, and all-default Properties store NULL."""

from __future__ import annotations

from dataclasses import fields

from appliance.protocol.packets import Properties, Will
from appliance.store.rows import properties_from_text, properties_to_text, will_from_text, will_to_text


def every_field_set() -> Properties:
    """A Properties with each field given a distinct non-default value of its type."""
    props = Properties()
    for i, f in enumerate(fields(Properties), start=1):
        current = getattr(props, f.name)
        if f.name == "user_properties":
            value = [("a", "1"), ("a", "2"), ("ключ", "値"), ("", "")]
        elif f.name == "subscription_identifiers":
            value = [1, 268_435_455]
        elif f.name in ("correlation_data", "authentication_data"):
            value = bytes(range(256)) + bytes([i])
        elif (
            "method" in f.name
            or "topic" in f.name
            or "type" in f.name
            or "information" in f.name
            or (f.name in ("assigned_client_identifier", "server_reference", "reason_string"))
        ):
            value = f"{f.name}-✓"
        else:
            value = i * 1000
        assert current is None or current == [], f.name
        setattr(props, f.name, value)
    return props


def test_every_property_round_trips():
    props = every_field_set()
    text = properties_to_text(props)
    assert text is not None
    assert properties_from_text(text) == props


def test_default_properties_store_as_null():
    assert properties_to_text(Properties()) is None
    assert properties_from_text(None) == Properties()


def test_single_field_round_trips_alone():
    props = Properties(payload_format_indicator=0)  # 0 is a value, not absence
    assert properties_from_text(properties_to_text(props)) == props


def test_will_round_trips():
    will = Will("last/will", b"\x00\x01bye", 2, True, every_field_set())
    assert will_from_text(will_to_text(will)) == will
    assert will_to_text(None) is None and will_from_text(None) is None
