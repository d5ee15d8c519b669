"""DeliveryLog writer: schema round trip of every kind, clocks, rotation, disk budget, recovery, restarts."""

import os
import pathlib
import shutil
import time

import pytest

from appliance.deliverylog import FIELDS, KINDS, DeliveryLogError, read_segment, read_segments
from appliance.deliverylog.schema import record_problems
from appliance.deliverylog.segments import PART, closed_segments
from appliance.protocol.reason_codes import ReasonCode

from .conftest import BOOT, SAMPLES


def _raw(directory):
    return read_segments(str(directory), fill_nulls=False)


def test_samples_cover_every_kind():
    assert set(SAMPLES) == set(KINDS)


def test_every_kind_round_trips_through_the_schema(make_log, tmp_path):
    log = make_log(strict=True)
    for kind in KINDS:
        log.emit(kind, **SAMPLES[kind])
    log.close()
    records = _raw(tmp_path / "log")
    assert [r["kind"] for r in records] == list(KINDS)
    for i, (kind, record) in enumerate(zip(KINDS, records, strict=True)):
        assert record_problems(record) == [], (kind, record)
        assert {k: record[k] for k in SAMPLES[kind]} == SAMPLES[kind]
        assert record["event_id"] == f"n1:{BOOT}:{i}"
        assert (record["fleet"], record["device"], record["node"], record["firmware"], record["boot_id"]) == (
            "fleet-1", "dev-1", "n1", "1.2.3", BOOT)
        assert (record["source"], record["schema_version"], record["clock_synced"]) == ("broker", 1, True)
    normalized = read_segments(str(tmp_path / "log"))
    assert normalized[KINDS.index("node_start")]["subscriber"] is None
    assert list(normalized[0]) == list(FIELDS)


def test_clocks_are_taken_at_emit_time_not_write_time(make_log, tmp_path):
    log = make_log(flush_interval_s=30.0)
    wall0, mono0 = time.time_ns() // 1000, time.monotonic_ns() // 1000
    log.emit("node_start")
    wall1, mono1 = time.time_ns() // 1000, time.monotonic_ns() // 1000
    time.sleep(0.3)  # the writer runs only at flush below, well after the emit
    log.flush()
    (record,) = _raw(tmp_path / "log")
    assert wall0 <= record["ts_wall_us"] <= wall1
    assert mono0 <= record["ts_mono_us"] <= mono1


def test_none_values_are_omitted_and_unknown_fields_dropped(make_log, tmp_path):
    log = make_log()
    log.emit("dropped", msg_id="m", subscriber=None, reason=ReasonCode.QUOTA_EXCEEDED, bogus=1)
    log.close()
    (record,) = _raw(tmp_path / "log")
    assert "subscriber" not in record and "bogus" not in record
    assert record["reason"] == "quota_exceeded"
    assert log.stats().bad_fields == 1


def test_strict_mode_rejects_bad_events(make_log):
    log = make_log(strict=True)
    with pytest.raises(ValueError, match="unknown delivery-log event kind"):
        log.emit("teleported")
    with pytest.raises(ValueError, match="not an emit field"):
        log.emit("acked", event_id="x")
    with pytest.raises(ValueError, match="must be int"):
        log.emit("acked", qos="1")


def test_clock_sync_flag_is_conservative_across_a_sync(make_log, tmp_path):
    synced = [False]
    log = make_log(clock_synced=lambda: synced[0], flush_interval_s=30.0, process=False)
    log.emit("node_start")
    log.flush()
    synced[0] = True
    log.emit("peer_up", peer_node="a")  # emitted before the writer saw the change: not trusted
    log.flush()
    log.emit("peer_up", peer_node="b")
    log.flush()
    assert [r["clock_synced"] for r in _raw(tmp_path / "log")] == [False, False, True]


def test_rotation_by_size_keeps_counters_contiguous(make_log, tmp_path):
    log = make_log(segment_bytes=1024, budget_bytes=1 << 30)
    for i in range(3000):
        log.emit("received", msg_id=f"n1:{i}", topic=f"t/{i % 7}", payload_size=i)
        if i % 100 == 99:
            log.flush()
    log.close()
    names = closed_segments(str(tmp_path / "log"))
    assert len(names) > 3
    expected_first = 0
    for name in names:
        content = read_segment(str(tmp_path / "log" / name))
        assert content.complete
        counters = [int(r["event_id"].rsplit(":", 1)[1]) for r in content.records]
        assert counters == list(range(expected_first, expected_first + len(counters)))
        assert name.endswith(f"_{expected_first:012d}{make_log.suffix}")
        expected_first += len(counters)
    assert expected_first == 3000
    assert not [n for n in os.listdir(tmp_path / "log") if n.endswith(PART)]


def test_rotation_by_age_and_on_demand(make_log, tmp_path):
    log = make_log(segment_age_s=0.2)
    log.emit("node_start")
    deadline = time.monotonic() + 20
    while not closed_segments(str(tmp_path / "log")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(closed_segments(str(tmp_path / "log"))) == 1
    log.emit("peer_up", peer_node="x")
    log.rotate()
    assert len(closed_segments(str(tmp_path / "log"))) == 2


def test_disk_budget_evicts_oldest_and_records_exactly_what_was_lost(make_log, tmp_path):
    # a Parquet file carries ~5 KiB of footer and page headers: tiny segments need a roomier budget
    segment, budget = (1024, 4096) if make_log.format == "jsonl.gz" else (4096, 40_000)
    log = make_log(segment_bytes=segment, budget_bytes=budget)
    total = 4000
    for i in range(total):
        log.emit("received", msg_id=f"n1:{i}", publisher=f"c{i}", topic=f"t/{i}", payload_size=i)
        if i % 100 == 99:
            log.flush()
    log.close()
    records = _raw(tmp_path / "log")
    evictions = [r for r in records if r["kind"] == "log_evicted"]
    kept = [int(r["event_id"].rsplit(":", 1)[1]) for r in records]
    assert evictions, "the budget must have forced evictions"
    lost: set[int] = set()
    lost_bytes = 0
    for e in evictions:
        words = dict(w.split("=", 1) for w in e["reason"].split()[1:])
        assert e["reason"].startswith("disk_budget ")
        first = int(words["first_event"].rsplit(":", 1)[1])
        last = int(words["last_event"].rsplit(":", 1)[1])
        assert int(words["events"]) == last - first + 1
        lost |= set(range(first, last + 1))
        lost_bytes += int(words["bytes"])
    assert lost.isdisjoint(kept)
    assert lost | set(kept) == set(range(max(kept) + 1))  # every event is either kept or reported lost
    assert log.stats().evicted_events == len(lost) and log.stats().evicted_bytes == lost_bytes
    sizes = [os.path.getsize(tmp_path / "log" / n) for n in closed_segments(str(tmp_path / "log"))]
    assert all(n.endswith(make_log.suffix) for n in closed_segments(str(tmp_path / "log")))
    assert sum(sizes) <= budget + max(sizes)


def test_backlog_overflow_is_recorded(make_log, tmp_path):
    log = make_log(max_backlog=10, flush_interval_s=30.0)
    for i in range(100):
        log.emit("committed", msg_id=f"m{i}")
    log.flush()
    log.close()
    records = _raw(tmp_path / "log")
    assert records[0]["kind"] == "log_evicted" and records[0]["reason"] == "backlog events=90"
    assert [r["msg_id"] for r in records[1:]] == [f"m{i}" for i in range(90, 100)]


def test_backlog_overflow_counts_positional_events_exactly(make_log, tmp_path):
    from appliance.broker.model import Message

    log = make_log(max_backlog=10, flush_interval_s=30.0)
    for i in range(30):  # a keyword event and three hot kinds, each in its lane
        m = Message(f"m{i}", "t/x", b"abc", 1, False, "pub", 0.0)
        (log.emit("dropped", msg_id=m.msg_id, reason="queue_full") if i % 4 == 0 else log.committed(m) if i % 4 == 1
         else log.acked(m, "sub", 1) if i % 4 == 2 else log.received(m, i))
    assert log.backlog == 30
    log.flush()
    log.close()
    records = _raw(tmp_path / "log")
    assert records[0]["kind"] == "log_evicted" and records[0]["reason"] == "backlog events=20"
    assert [r["msg_id"] for r in records[1:]] == [f"m{i}" for i in range(20, 30)]
    assert [r["kind"] for r in records[1:5]] == ["dropped", "committed", "acked", "received"]


def test_lanes_batches_parse_into_emit_order_or_fail_loudly():
    from appliance.deliverylog.batch import fixed_flat, keep_newest, lane_counts, lanes_flat

    # lanes: keyword events, received, committed, routed, delivered, acked
    lanes = [["node_start", 4, {}], [], [2, "m1"], [6, "m1", "s", "f/#", 1], [], [4, "m1", "s", 1]]
    assert lane_counts(lanes) == [1, 0, 1, 1, 0, 1]
    # by clock; equal clocks (node_start and acked at 4) keep lane order: keyword events first
    assert lanes_flat(lanes, 100) == ["committed", 102, 2, ("m1",), "node_start", 104, 4, {}, "acked", 104, 4,
                                      ("m1", "s", 1), "routed", 106, 6, ("m1", "s", "f/#", 1)]
    kept, dropped = keep_newest(lanes, 2)
    assert dropped == 1 and lanes_flat(kept, 0)[0::4] == ["node_start", "acked", "routed"]  # a tie at the cut stays
    assert keep_newest(lanes, 4) == (lanes, 0)
    for bad in ([[], [], [2], [], [], []], lanes[:5], [[], [], [], ["x", "m1", "s", "f/#"], [], []]):
        with pytest.raises(ValueError):
            lanes_flat(bad, 0)
    queued = ["committed", 2, "m1", "node_start", 4, {}, "routed", 6, "m1", "s", "f/#", 1]  # earlier versions' form
    assert fixed_flat(queued, 100) == ["committed", 102, 2, ("m1",), "node_start", 104, 4, {}, "routed", 106, 6,
                                       ("m1", "s", "f/#", 1)]
    for bad in (queued[:-1], queued[:2], ["no_such_kind", 1, "m1"]):
        with pytest.raises(ValueError):
            fixed_flat(bad, 0)


def test_a_wall_clock_step_marks_the_batch_it_falls_in_unsynchronised(make_log, tmp_path, monkeypatch):
    """Events read CLOCK_MONOTONIC only; the wall time is derived from the offset the drain reads around each batch."""
    from appliance.deliverylog import sink

    step = [0]
    monkeypatch.setattr(sink, "_time_ns", lambda: time.time_ns() + step[0])
    log = make_log(flush_interval_s=30.0)
    log.emit("peer_up", peer_node="a")
    log.flush()
    step[0] = 3_600 * 10**9  # the wall clock jumps an hour ahead
    wall = (time.time_ns() + step[0]) // 1000
    log.emit("peer_up", peer_node="b")  # in the batch whose drain sees the step
    log.flush()
    log.emit("peer_up", peer_node="c")
    log.flush()
    log.close()
    a, b, c = _raw(tmp_path / "log")
    assert [r["clock_synced"] for r in (a, b, c)] == [True, False, True]
    assert a["ts_wall_us"] < wall - 3_599 * 10**6 and wall <= b["ts_wall_us"] <= c["ts_wall_us"] < wall + 10**7
    assert a["ts_mono_us"] < b["ts_mono_us"] < c["ts_mono_us"]


def _flushed_part(make_log, directory, batches):
    """Write `batches` flushes of events, leave the segment open, and return (part path, flushed msg ids)."""
    from appliance.broker.model import Message

    log = make_log(directory)
    ids = []
    for b in range(batches):
        for i in range(50):
            if i % 2:
                log.emit("routed", msg_id=f"m{b}-{i}", subscriber=f"s{i % 3}", filter="a/#", qos=1)
            else:  # the broker's positional path, interleaved
                log.routed(Message(f"m{b}-{i}", "a/b", b"", 1, False, "p", 0.0), f"s{i % 3}", "a/#", 1)
            ids.append(f"m{b}-{i}")
        log.flush()
    (part,) = [n for n in os.listdir(directory) if n.endswith(PART)]
    return os.path.join(directory, part), ids, log


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.77, 1.0])
def test_truncated_part_is_recovered_with_its_good_records(make_log, tmp_path, cut):
    part, ids, log = _flushed_part(make_log, str(tmp_path / "a"), 5)
    crashed = tmp_path / "b"
    crashed.mkdir()
    data = pathlib.Path(part).read_bytes()
    (crashed / os.path.basename(part)).write_bytes(data[: int(len(data) * cut)])
    shutil.copy(os.path.join(tmp_path / "a", ".n1.state"), crashed / ".n1.state")
    recovered = make_log(crashed)
    recovered.close()
    got = [r["msg_id"] for r in _raw(crashed)]
    assert got == ids[: len(got)]  # a clean prefix: nothing garbled, nothing reordered
    if cut == 1.0:
        assert got == ids  # everything flushed survives
    assert not [n for n in os.listdir(crashed) if n.endswith(PART)]
    assert all(read_segment(str(crashed / n)).complete for n in closed_segments(str(crashed)))
    log.close()


def test_garbage_after_the_last_flush_is_dropped(make_log, tmp_path):
    part, ids, log = _flushed_part(make_log, str(tmp_path / "a"), 3)
    crashed = tmp_path / "b"
    crashed.mkdir()
    (crashed / os.path.basename(part)).write_bytes(pathlib.Path(part).read_bytes() + b"\0" * 4096)
    make_log(crashed).close()
    assert [r["msg_id"] for r in _raw(crashed)] == ids
    log.close()


def test_restart_in_the_same_boot_never_reuses_an_event_id(make_log, tmp_path):
    for run in range(3):
        log = make_log()
        for i in range(5):
            log.emit("committed", msg_id=f"r{run}-{i}")
        log.close()
    ids = [r["event_id"] for r in _raw(tmp_path / "log")]
    assert len(ids) == 15 and len(set(ids)) == 15
    counters = [int(i.rsplit(":", 1)[1]) for i in ids]
    assert counters == sorted(counters)


def test_new_boot_restarts_counters_and_keeps_segment_age_order(make_log, tmp_path):
    other_boot = "99999999-0000-4000-8000-000000000000"
    first = make_log(boot_id=other_boot)
    first.emit("node_start")
    first.close()
    log = make_log()
    log.emit("node_start")
    log.close()
    records = _raw(tmp_path / "log")
    assert [r["event_id"] for r in records] == [f"n1:{other_boot}:0", f"n1:{BOOT}:0"]


def test_a_second_writer_for_the_same_node_is_refused(make_log, tmp_path):
    make_log()
    with pytest.raises(DeliveryLogError, match="already in use"):
        make_log()
    make_log(node="n2").close()  # another node may share the directory


def test_limits_are_checked(make_log):
    with pytest.raises(DeliveryLogError, match="at least twice"):
        make_log(segment_bytes=1 << 20, budget_bytes=1 << 20)
    with pytest.raises(DeliveryLogError, match="source"):
        make_log(source="satellite")


def test_a_broker_message_is_expanded_into_schema_fields(make_log, tmp_path):
    from appliance.broker.model import Message
    from appliance.protocol.packets import Properties

    props = Properties(user_properties=[("other", "x"), ("n", "12345678901")])
    message = Message("n1:77", "plant/t", b"0123456789", 1, True, "pub-9", time.time(), properties=props)
    log = make_log(seq_property="n", strict=True)
    log.emit("received", message=message, publisher_packet_id=4)
    log.emit("routed", message=message, subscriber="s", filter="plant/#", qos=0)
    log.emit("acked", message=message, subscriber="s")
    log.emit("dropped", message=Message("n1:78", "t", b"", 0, False, "", 0.0), reason="queue_full")
    log.close()
    received, routed, acked, dropped = _raw(tmp_path / "log")
    assert {k: received.get(k) for k in ("msg_id", "publisher", "publisher_packet_id", "publisher_seq", "topic", "qos",
                                          "retain", "payload_size")} == {
        "msg_id": "n1:77", "publisher": "pub-9", "publisher_packet_id": 4, "publisher_seq": 12345678901,
        "topic": "plant/t", "qos": 1, "retain": True, "payload_size": 10}
    assert (routed["msg_id"], routed["qos"], routed["filter"], "topic" in routed) == ("n1:77", 0, "plant/#", False)
    assert acked["msg_id"] == "n1:77" and "publisher_seq" not in acked
    assert dropped["msg_id"] == "n1:78" and "publisher" not in dropped and "publisher_seq" not in dropped
    with pytest.raises(ValueError, match="must be a broker Message"):
        make_log(directory=tmp_path / "other", strict=True).emit("received", message="n1:1")


def test_queued_events_keep_no_broker_object_alive(make_log, tmp_path):
    import gc

    from appliance.broker.model import Message
    from appliance.protocol.packets import Properties

    props = Properties(user_properties=[("seq", "7")])
    message = Message("n1:90", "plant/t", b"xy", 1, False, "pub-1", 0.0, properties=props)
    log = make_log(flush_interval_s=30.0)
    log.emit("received", message=message, publisher_packet_id=9)
    log.emit("delivered", message=message, subscriber="s", qos=1, attempt=1, dup=False)
    assert log.backlog == 2
    queued = list(log._lanes[0])  # keyword events: kind, mono, fields
    assert not [r for r in gc.get_referents(*queued) if r is message or r is props or r is props.user_properties]
    tracked = [entry for entry in queued if gc.is_tracked(entry)]  # only the received event's fields hold a container
    assert tracked == [queued[2]] and isinstance(queued[2]["message"], tuple)
    log.close()
    received, delivered = _raw(tmp_path / "log")
    assert (received["msg_id"], received["publisher_seq"], received["payload_size"]) == ("n1:90", 7, 2)
    assert (delivered["msg_id"], delivered["subscriber"], "topic" in delivered) == ("n1:90", "s", False)


def _without_stamps(records):
    return [{k: v for k, v in r.items() if k not in ("event_id", "ts_wall_us", "ts_mono_us")} for r in records]


def test_positional_events_write_the_records_emit_writes(make_log, tmp_path):
    from appliance.broker.model import Message
    from appliance.protocol.packets import Properties
    from appliance.protocol.reason_codes import ReasonCode

    props = Properties(user_properties=[("other", "x"), ("n", "-12")])
    message = Message("n1:5", "plant/t", b"0123", 1, False, "pub-9", time.time(), properties=props)
    anonymous = Message("n1:6", "plant/u", b"", 0, True, "", time.time())
    fast = make_log(directory=tmp_path / "fast", seq_property="n", strict=True)
    slow = make_log(directory=tmp_path / "slow", seq_property="n", node="n1b")
    for m in (message, anonymous):
        fast.received(m, 4 if m.qos else None)
        slow.emit("received", message=m, publisher_packet_id=4 if m.qos else None)
        fast.committed(m)
        slow.emit("committed", message=m)
        fast.routed(m, "s", "plant/#", m.qos)
        slow.emit("routed", message=m, subscriber="s", filter="plant/#", qos=m.qos)
        fast.delivered(m, "s", m.qos, True, 2)
        slow.emit("delivered", message=m, subscriber="s", qos=m.qos, dup=True, attempt=2)
        fast.acked(m, "s", m.qos)
        slow.emit("acked", message=m, subscriber="s", qos=m.qos)
    fast.close()
    slow.close()
    got = _without_stamps(_raw(tmp_path / "fast"))
    want = [{**r, "node": "n1"} for r in _without_stamps(_raw(tmp_path / "slow"))]
    assert got == want and len(got) == 10
    assert got[0]["publisher_seq"] == -12 and "publisher" not in got[5] and "publisher_seq" not in got[5]
    with pytest.raises(ValueError, match="routed: field 'qos' must be"):
        make_log(directory=tmp_path / "strict", strict=True).routed(message, "s", "f", "1")
    odd = make_log(directory=tmp_path / "odd")  # an IntEnum value is written as its number
    odd.routed(message, "s", "plant/#", ReasonCode.GRANTED_QOS_1)
    odd.close()
    (routed,) = _raw(tmp_path / "odd")
    assert routed["qos"] == 1 and type(routed["qos"]) is int


def test_a_positional_event_of_unknown_layout_keeps_its_record_without_fields(tmp_path):
    from appliance.deliverylog.identity import Identity
    from appliance.deliverylog.writer import Limits, SegmentWriter

    writer = SegmentWriter(str(tmp_path / "w"), Identity("f", "d", "n1", "1", BOOT), Limits(format="jsonl.gz"),
                           lambda: True)
    now, mono = time.time_ns(), time.monotonic_ns()
    writer.write([("routed", now, mono, ("n1:1", "s")), ("acked", now, mono, ("n1:1", "s", 1))])
    writer.close()
    routed, acked = _raw(tmp_path / "w")
    assert routed["kind"] == "routed" and "msg_id" not in routed and writer.stats.bad_fields == 2
    assert (acked["msg_id"], acked["subscriber"], acked["qos"]) == ("n1:1", "s", 1)
