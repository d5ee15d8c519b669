"""Generated fleet with injected faults: the report's counts equal the injected counts exactly."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.spark


def test_fates_duplicates_and_ordering_equal_injected_counts(generated: dict[str, Any]) -> None:
    expected, summary = generated["manifest"]["expected"], generated["summary"]
    injected = generated["manifest"]["injected"]
    assert all(injected[k] > 0 for k in ("loss", "dup", "reorder", "drop", "expire", "unacked")), injected
    assert summary["pairs"] == generated["manifest"]["pairs"]
    assert summary["fates"] == expected["fates"]
    assert summary["duplicated"] == expected["duplicated"]
    assert summary["ordering"]["late"] == expected["late"]
    assert summary["ordering"]["inversions"] == expected["inversions"]
    assert summary["e2e"]["lost"] == expected["e2e"]["lost"]
    assert summary["e2e"]["duplicated"] == expected["e2e"]["duplicated"]


def test_clock_steps_incidents_and_upload_faults_equal_injected_counts(generated: dict[str, Any]) -> None:
    expected, summary, upload = generated["manifest"]["expected"], generated["summary"], generated["upload"]
    assert summary["clocks"]["stepped"] == expected["clock_stepped_boots"] > 0
    assert {k: v["count"] for k, v in summary["incidents"].items()} == expected["incidents"]
    assert summary["ingest"]["quarantined"] == upload["quarantined"]
    assert summary["ingest"]["duplicates_removed"] == upload["duplicates"] > 0


def test_clock_steps_do_not_distort_latency(generated: dict[str, Any]) -> None:
    lat = generated["summary"]["latency"]
    # the generator's receive->deliver latency is 0.75..3.1 ms except reordered deliveries (+2.5 intervals)
    assert 500 <= lat["receive_deliver"]["p50_us"] <= 3_100
    assert lat["inter_node"]["untrusted_clock"] == 0 and lat["inter_node"]["max_us"] == 400
    assert lat["receive_commit"]["p99_us"] == 150
