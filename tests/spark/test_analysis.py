"""Small hand-built fleets with known answers, run through the real ingest and analyze jobs; outputs compared inline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
from chispa import assert_df_equality
from pyspark.sql import functions as F

from cloud_spark import jobs
from tests.spark.fleetdata import MS, T0, Node, S, write_by_device

pytestmark = pytest.mark.spark
W = T0 + 600 * S  # analysis window end
N1 = Node("n1", "d1", "1.0")
N2 = Node("n2", "d2", "2.0", skew_us=-1000 * S, synced_from_us=T0 + 250 * S)  # NTP step at T0+250s
N3 = Node("n3", "d3", "2.0", skew_us=2 * S, synced_from_us=None)  # never synced
S2 = Node("s2", "d1", "client", source="client")


def message(node: Node, msg: str, pub: str, seq: int, at: int, qos: int = 1) -> list[dict[str, Any]]:
    common = {"msg_id": msg, "publisher": pub, "publisher_seq": seq, "topic": "t/x", "qos": qos}
    return [node.event("received", at, **common), node.event("committed", at + 200, **common)]


def sub_event(node: Node, kind: str, msg: str, sub: str, at: int, qos: int = 1, **kw: Any) -> dict[str, Any]:
    return node.event(kind, at, msg_id=msg, subscriber=sub, qos=qos, **kw)


def seed_scenario() -> list[dict[str, Any]]:
    """Publisher pA sends A B C D E (seq 1..5); subscriber s1 receives A D E B C."""
    recs: list[dict[str, Any]] = []
    arrive = {"A": 5, "D": 45, "E": 50, "B": 55, "C": 60}
    for i, m in enumerate("ABCDE"):
        at = T0 + i * 10 * MS
        recs += message(N1, m, "pA", i + 1, at)
        recs.append(sub_event(N1, "routed", m, "s1", at + 300))
        recs.append(sub_event(N1, "delivered", m, "s1", T0 + arrive[m] * MS, dup=False, attempt=1))
        recs.append(sub_event(N1, "acked", m, "s1", T0 + arrive[m] * MS + MS))
    return recs


def fate_scenario() -> list[dict[str, Any]]:
    """Publisher pB, subscriber s2 (which keeps a receipt log): one message per fate."""
    recs: list[dict[str, Any]] = []

    def pub(m: str, at_s: int, qos: int = 1) -> int:
        at = T0 + at_s * S  # publisher_seq follows publish time: seq = at_s
        recs.extend(message(N1, m, "pB", at_s, at, qos))
        recs.append(sub_event(N1, "routed", m, "s2", at + 300, qos))
        return at

    def got(at: int, times: int = 1) -> None:
        seq = (at - T0) // S
        for k in range(times):
            recs.append(S2.event("client_received", at + MS + 500 + k * S, publisher="pB", publisher_seq=seq,
                                 subscriber="s2"))

    at = pub("F1", 140, qos=0)
    recs.append(sub_event(N1, "delivered", "F1", "s2", at + MS, qos=0))
    got(at)
    at = pub("F2", 110)
    recs.append(sub_event(N1, "delivered", "F2", "s2", at + MS))
    got(at)
    at = pub("F3", 150)
    recs.append(sub_event(N1, "dropped", "F3", "s2", at + MS, reason="queue_full"))
    at = pub("F4", 160)
    recs.append(sub_event(N1, "queued_offline", "F4", "s2", at + MS))
    recs.append(sub_event(N1, "expired", "F4", "s2", at + 10 * S, reason="message_expiry"))
    pub("F5", 120)
    pub("F6", 590)
    at = pub("F7", 180)
    recs.append(sub_event(N1, "queued_offline", "F7", "s2", at + MS))
    at = pub("F8", 190)
    recs.append(sub_event(N1, "delivered", "F8", "s2", at + MS, dup=False, attempt=1))
    recs.append(sub_event(N1, "delivered", "F8", "s2", at + 2 * S, dup=True, attempt=2))
    recs.append(sub_event(N1, "acked", "F8", "s2", at + 2 * S + MS))
    got(at, times=2)
    at = pub("F9", 595)
    recs.append(sub_event(N1, "delivered", "F9", "s2", at + MS))
    got(at)
    # dropped at ingress (too large): no subscriber involved
    recs.append(N1.event("received", T0 + 200 * S, msg_id="Z", publisher="pB", topic="t/x", qos=1))
    recs.append(N1.event("dropped", T0 + 200 * S + 10, msg_id="Z", reason="too_large"))
    return recs


def latency_scenario() -> list[dict[str, Any]]:
    """X: n1 -> n2 (n2 synced by then), Y: n1 -> n3 (n3 never synced); n1 loses its peer n2 for 30 s."""
    recs: list[dict[str, Any]] = []
    at = T0 + 300 * S
    recs += message(N1, "X", "pC", 1, at)
    recs.append(N1.event("forwarded", at + 1 * MS, msg_id="X", peer_node="n2"))
    recs.append(N1.event("forward_acked", at + 3 * MS, msg_id="X", peer_node="n2"))
    recs.append(sub_event(N2, "routed", "X", "s3", at + 2 * MS))
    recs.append(sub_event(N2, "delivered", "X", "s3", at + 4 * MS))
    recs.append(sub_event(N2, "acked", "X", "s3", at + 5 * MS))
    at = T0 + 310 * S
    recs += message(N1, "Y", "pC", 2, at)
    recs.append(sub_event(N3, "routed", "Y", "s4", at + 2 * MS))
    recs.append(sub_event(N3, "delivered", "Y", "s4", at + 4 * MS))
    recs.append(sub_event(N3, "acked", "Y", "s4", at + 5 * MS))
    recs.append(N2.event("node_start", T0 + 1 * S))  # before its NTP sync: wall clock 1000 s behind
    recs.append(N1.event("peer_down", T0 + 100 * S, peer_node="n2"))
    recs.append(N1.event("peer_up", T0 + 130 * S, peer_node="n2"))
    recs.append(N2.event("node_stop", T0 + 400 * S))
    return recs


@pytest.fixture(scope="module")
def out(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("segments")
    recs = seed_scenario() + fate_scenario() + latency_scenario()
    write_by_device(src, recs)
    dst = tmp_path_factory.mktemp("tables")
    stats = jobs.ingest_job(spark, str(src), str(dst))
    assert stats["quarantined"] == {} and stats["duplicates_removed"] == 0
    jobs.analyze_job(spark, str(dst), window_end_us=W, ingest_summary=stats)
    return dst


def test_seed_sequence_ADEBC_is_two_late_deliveries(spark: Any, out: Path) -> None:
    late = spark.read.parquet(f"{out}/late").where("publisher = 'pA'").select(
        "publisher", "subscriber", "msg_id", "publish_rank", "displacement", "late_by_us")
    expected = spark.createDataFrame(
        [("pA", "s1", "B", 2, 2, 10 * MS), ("pA", "s1", "C", 3, 2, 15 * MS)],
        "publisher string, subscriber string, msg_id string, publish_rank long, displacement int, late_by_us long")
    assert_df_equality(late, expected, ignore_row_order=True, ignore_nullable=True)
    streams = spark.read.parquet(f"{out}/streams").select("publisher", "subscriber", "deliveries", "late",
                                                           "inversions", "max_displacement")
    expected = spark.createDataFrame(
        [("pA", "s1", 5, 2, 4, 2), ("pB", "s2", 4, 0, 0, 0), ("pC", "s3", 1, 0, 0, 0), ("pC", "s4", 1, 0, 0, 0)],
        "publisher string, subscriber string, deliveries long, late long, inversions long, max_displacement int")
    assert_df_equality(streams, expected, ignore_row_order=True, ignore_nullable=True)


def test_every_fate_including_pending_and_end_to_end(spark: Any, out: Path) -> None:
    fate = spark.read.parquet(f"{out}/fate").where("subscriber = 's2'").select(
        "msg_id", "fate", "reason", "deliveries", "duplicated", "e2e_receipts", "e2e_fate")
    expected = spark.createDataFrame([
        ("F1", "delivered", None, 1, False, 1, "received"),
        ("F2", "delivered_not_acked", None, 1, False, 1, "received"),
        ("F3", "dropped", "queue_full", 0, False, 0, "dropped"),
        ("F4", "expired", None, 0, False, 0, "expired"),
        ("F5", "lost", None, 0, False, 0, "lost"),
        ("F6", "pending", "in_flight", 0, False, 0, "pending"),
        ("F7", "pending", "queued_offline", 0, False, 0, "pending"),
        ("F8", "acked", None, 2, True, 2, "duplicated"),
        ("F9", "pending", "awaiting_ack", 1, False, 1, "received"),
    ], "msg_id string, fate string, reason string, deliveries int, duplicated boolean, e2e_receipts int, "
       "e2e_fate string")
    assert_df_equality(fate, expected, ignore_row_order=True, ignore_nullable=True)
    no_client_log = spark.read.parquet(f"{out}/fate").where("subscriber = 's1'")
    assert no_client_log.where(F.col("e2e_fate").isNotNull()).count() == 0
    drops = spark.read.parquet(f"{out}/ingress_drops").select("reason", "messages")
    assert_df_equality(drops, spark.createDataFrame([("too_large", 1)], "reason string, messages long"),
                       ignore_nullable=True)


def test_latency_per_hop_uses_the_right_clock(spark: Any, out: Path) -> None:
    lat = spark.read.parquet(f"{out}/latency").where(F.col("msg_id").isin("X", "Y")).select(
        "hop", "msg_id", "from_node", "to_node", "latency_us", "method", "clock_ok")
    expected = spark.createDataFrame([
        ("receive_commit", "X", "n1", "n1", 200, "monotonic", True),
        ("receive_deliver", "X", "n1", "n2", 4 * MS, "wall", True),
        ("deliver_ack", "X", "n2", "n2", 1 * MS, "monotonic", True),
        ("forward_rtt", "X", "n1", "n1", 2 * MS, "monotonic", True),
        ("inter_node", "X", "n1", "n2", 1 * MS, "wall", True),
        ("receive_commit", "Y", "n1", "n1", 200, "monotonic", True),
        ("receive_deliver", "Y", "n1", "n3", 4 * MS + 2 * S, "wall", False),
        ("deliver_ack", "Y", "n3", "n3", 1 * MS, "monotonic", True),
    ], "hop string, msg_id string, from_node string, to_node string, latency_us long, method string, "
       "clock_ok boolean")
    assert_df_equality(lat, expected, ignore_row_order=True, ignore_nullable=True)
    summary = json.loads((out / "summary.json").read_text())
    # receive->deliver: A..E 5 45 40 15 10 ms, F1 F2 F8 F9 1 ms each, X 4 ms (10 trusted); Y untrusted
    rd = summary["latency"]["receive_deliver"]
    assert rd["untrusted_clock"] == 1 and rd["measured"] == 11
    assert rd["p50_us"] == 4 * MS and rd["p95_us"] == 45 * MS and rd["max_us"] == 45 * MS
    assert summary["latency"]["receive_commit"]["p99_us"] == 200


def test_clocks_flag_steps_and_unsynced_boots(spark: Any, out: Path) -> None:
    clocks = spark.read.parquet(f"{out}/clocks")
    got = clocks.select("node", "boot_synced", "clock_stepped", "unsynced_events").where("node like 'n%'")
    expected = spark.createDataFrame([("n1", True, False, 0), ("n2", True, True, 1), ("n3", False, False, 3)],
                                     "node string, boot_synced boolean, clock_stepped boolean, unsynced_events long")
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_incident_windows_joined_with_losses(spark: Any, out: Path) -> None:
    inc = spark.read.parquet(f"{out}/incidents").select(
        "incident", "node", "peer_node", "start_us", "end_us", "open", "lost", "delivered_not_acked", "late")
    expected = spark.createDataFrame([
        ("peer_down", "n1", "n2", T0 + 100 * S, T0 + 130 * S, False, 1, 1, 0),
        ("node_stop", "n2", None, T0 + 400 * S, W, True, 0, 0, 0),
    ], "incident string, node string, peer_node string, start_us long, end_us long, open boolean, lost long, "
       "delivered_not_acked long, late long")
    assert_df_equality(inc, expected, ignore_row_order=True, ignore_nullable=True)


def test_rollups_by_device_firmware_and_hour(spark: Any, out: Path) -> None:
    fw = spark.read.parquet(f"{out}/rollup_firmware").select("firmware", "pairs", "lost", "pending", "late")
    expected = spark.createDataFrame([("1.0", 14, 1, 3, 2), ("2.0", 2, 0, 0, 0)],
                                     "firmware string, pairs long, lost long, pending long, late long")
    assert_df_equality(fw, expected, ignore_row_order=True, ignore_nullable=True)
    hour = spark.read.parquet(f"{out}/rollup_hour").select(F.date_format("hour", "HH:mm").alias("h"), "pairs")
    assert_df_equality(hour, spark.createDataFrame([("01:00", 16)], "h string, pairs long"), ignore_nullable=True)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fates"] == {"acked": 8, "delivered": 1, "delivered_not_acked": 1, "dropped": 1, "expired": 1,
                                "lost": 1, "pending": 3}
    assert summary["ordering"]["late"] == 2 and summary["ordering"]["inversions"] == 4


def crash_scenario() -> list[dict[str, Any]]:
    """c1 is killed with -9 after routing M2 (no node_stop) and restarts in the same kernel boot; later it stops
    cleanly and starts again. c2 starts once. Only the first restart is a crash."""
    c1, c2 = Node("c1", "dc1"), Node("c2", "dc2")
    recs = [c1.event("node_start", T0 + 1 * S), c2.event("node_start", T0 + 2 * S)]

    def msg(m: str, seq: int, at: int, delivered: bool) -> None:
        recs.extend(message(c1, m, "pK", seq, at))
        recs.append(sub_event(c1, "routed", m, "k1", at + 300))
        if delivered:
            recs.append(sub_event(c1, "delivered", m, "k1", at + MS))
            recs.append(sub_event(c1, "acked", m, "k1", at + 2 * MS))

    msg("M1", 1, T0 + 10 * S, True)
    msg("M2", 2, T0 + 50 * S, False)  # its `routed` is c1's last event before the crash; M2 is lost
    recs.append(c1.event("node_start", T0 + 80 * S))
    msg("M3", 3, T0 + 90 * S, True)
    msg("M4", 4, T0 + 100 * S, False)  # lost, but outside every incident window
    recs.append(c1.event("node_stop", T0 + 120 * S, reason="shutdown"))
    recs.append(c1.event("node_start", T0 + 130 * S))
    recs.append(c2.event("peer_up", T0 + 3 * S, peer_node="c1"))
    return recs


def test_a_restart_without_node_stop_is_a_crash_window_joined_with_its_losses(
        spark: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    src, dst = tmp_path_factory.mktemp("crash-segments"), tmp_path_factory.mktemp("crash-tables")
    write_by_device(src, crash_scenario())
    stats = jobs.ingest_job(spark, str(src), str(dst))
    summary = jobs.analyze_job(spark, str(dst), window_end_us=W, ingest_summary=stats)
    inc = spark.read.parquet(f"{dst}/incidents").select(
        "incident", "node", "peer_node", "start_us", "end_us", "open", "lost", "late")
    expected = spark.createDataFrame([
        ("node_crash", "c1", None, T0 + 50 * S + 300, T0 + 80 * S, False, 1, 0),
        ("node_stop", "c1", None, T0 + 120 * S, T0 + 130 * S, False, 0, 0),
    ], "incident string, node string, peer_node string, start_us long, end_us long, open boolean, lost long, "
       "late long")
    assert_df_equality(inc, expected, ignore_row_order=True, ignore_nullable=True)
    assert summary["fates"]["lost"] == 2
    assert summary["incidents"]["node_crash"] == {"count": 1, "lost": 1, "late": 0}
