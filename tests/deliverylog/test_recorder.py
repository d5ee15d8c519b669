"""The C recorder (_recorder.c): what it records decodes to exactly the lanes the pure-Python sink would queue."""

import shutil
import sys
import sysconfig
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.deliverylog import DeliveryLog, DeliveryLogError, read_segments
from appliance.deliverylog import batch as batch_module
from appliance.deliverylog.batch import LANE_KINDS, LANE_WIDTHS, NativeRecorder, with_recorded

from .conftest import BOOT

native = pytest.mark.skipif(NativeRecorder is None, reason="the C recorder is not built")


def test_the_recorder_is_built_wherever_a_c_compiler_is():
    """setup.py's extension is optional: this is what notices when it silently failed to build."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None or not sysconfig.get_paths()["include"]:
        pytest.skip("no C compiler here: the pure-Python lanes are used")
    assert NativeRecorder is not None, "a C compiler is here but appliance.deliverylog._recorder did not build"


def _events():
    """One event per hot kind with every value type the broker passes, and the odd ones (big ints, non-ASCII...)."""
    big = 2**63 + 5
    return [
        ("received", ("n1-19a-1", "pub-1", "a/b", 1, False, 12, [("seq", "41")], 7)),
        ("received", ("n1-19a-2", "", "ü/日本", 0, True, 0, None, None)),
        ("received", ("n1-19a-3", "p", "t", 2, False, 70000, (("k", "v"), ("k", "w")), 65535)),
        ("committed", ("n1-19a-1",)),
        ("routed", ("n1-19a-1", "sub-1", "a/+", 1)),
        ("delivered", ("n1-19a-1", "sub-1", 1, True, 300)),
        ("acked", ("n1-19a-1", "sub-1", big)),
        ("acked", ("m\udcff", "s", -(2**63))),
        ("acked", ("m", "s", 1.5)),
        ("acked", ("m", "s", [[[[["deep"]]]]])),
        ("acked", ("m", "s", -1)),
    ]


def _record(rec, events):
    for kind, values in events:
        getattr(rec, kind)(*values)


def _pure_lanes(events, clocks):
    """The lanes the pure-Python sink queues for `events`, with `clocks` (one per event, in order) as their clocks."""
    lanes = [[] for _ in LANE_WIDTHS]
    for (kind, values), clock in zip(events, clocks, strict=True):
        lanes[1 + LANE_KINDS.index(kind)].extend((clock, *values))
    return lanes


def _clocks(lanes, events):
    """Each event's clock in `lanes` (decoded), in the order the events were recorded."""
    seen = [0] * len(LANE_WIDTHS)
    out = []
    for kind, _ in events:
        k = 1 + LANE_KINDS.index(kind)
        out.append(lanes[k][seen[k] * LANE_WIDTHS[k]])
        seen[k] += 1
    return out


@native
def test_recorded_events_decode_to_the_pure_lanes_value_for_value():
    rec = NativeRecorder(LANE_WIDTHS)
    events = _events()
    before = time.monotonic_ns()
    _record(rec, events)
    after = time.monotonic_ns()
    assert len(rec) == len(events)
    data = rec.take()
    assert len(rec) == 0 and rec.take() == b""
    decoded = with_recorded([[] for _ in LANE_WIDTHS], data)
    clocks = _clocks(decoded, events)
    assert before <= clocks[0] and clocks == sorted(clocks) and clocks[-1] <= after  # time.monotonic_ns's clock
    want = _pure_lanes(events, clocks)
    assert decoded == want
    assert [type(v) for lane in decoded for v in lane] == [type(v) for lane in want for v in lane]


@native
def test_a_bad_event_raises_and_leaves_no_partial_record():
    rec = NativeRecorder(LANE_WIDTHS)
    rec.committed("m1")
    with pytest.raises(TypeError, match="takes 1 values, got 2"):
        rec.committed("m2", "extra")
    with pytest.raises(TypeError, match="takes 3 values, got 0"):
        rec.acked()
    with pytest.raises(TypeError, match="builtin"):
        rec.routed("m3", "sub", object(), 1)  # fails after two values were written: rolled back
    rec.acked("m4", "s", 1)
    assert len(rec) == 2
    lanes = with_recorded([[] for _ in LANE_WIDTHS], rec.take())
    assert lanes == [[], [], [lanes[2][0], "m1"], [], [], [lanes[5][0], "m4", "s", 1]]
    with pytest.raises(TypeError):
        NativeRecorder((3, 9))


@native
def test_every_truncation_of_a_buffer_fails_loudly_or_is_a_whole_prefix():
    rec = NativeRecorder(LANE_WIDTHS)
    events = _events()
    bounds = [0]
    for event in events:
        _record(rec, [event])
        bounds.append(len(rec.take()) + bounds[-1])
    _record(rec, events)
    data = rec.take()
    assert len(data) == bounds[-1]
    empty = [[] for _ in LANE_WIDTHS]
    whole = with_recorded(empty, data)
    for cut in range(len(data)):
        if cut in bounds:
            head = events[: bounds.index(cut)]
            assert with_recorded(empty, data[:cut]) == _pure_lanes(head, _clocks(whole, events)[: len(head)])
        else:
            with pytest.raises(ValueError, match="do not decode"):
                with_recorded(empty, data[:cut])


@native
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_never_crashes_the_decoder(data):
    try:
        lanes = with_recorded([[] for _ in LANE_WIDTHS], data)
    except ValueError:
        return
    for lane, width in zip(lanes[1:], LANE_WIDTHS[1:], strict=True):
        assert len(lane) % width == 0


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=12)


@native
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(LANE_KINDS), st.data()), max_size=8))
def test_any_builtin_values_round_trip(draws):
    events = []
    for kind, data in draws:
        width = LANE_WIDTHS[1 + LANE_KINDS.index(kind)] - 1
        events.append((kind, tuple(data.draw(st.lists(values, min_size=width, max_size=width)))))
    rec = NativeRecorder(LANE_WIDTHS)
    _record(rec, events)
    lanes = with_recorded([[] for _ in LANE_WIDTHS], rec.take())
    assert lanes == _pure_lanes(events, _clocks(lanes, events))


@native
def test_a_take_racing_the_recording_thread_splits_on_whole_events():
    rec = NativeRecorder(LANE_WIDTHS)
    n = 50_000
    taken = []
    done = threading.Event()

    def record():
        for i in range(n):
            rec.routed(f"m{i}", "sub", "a/#", i)
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # force thread switches between (never inside) C calls
    try:
        t = threading.Thread(target=record)
        t.start()
        while not done.is_set():
            taken.append(rec.take())
        t.join()
    finally:
        sys.setswitchinterval(old)
    taken.append(rec.take())
    assert sum(1 for chunk in taken if chunk) > 2
    lanes = [[] for _ in LANE_WIDTHS]
    for chunk in taken:
        lanes = with_recorded(lanes, chunk)
    assert lanes[3][4::5] == list(range(n)) and lanes[3][1::5] == [f"m{i}" for i in range(n)]
    assert lanes[3][0::5] == sorted(lanes[3][0::5])


def test_native_true_without_the_recorder_is_refused(tmp_path, monkeypatch):
    import appliance.deliverylog.sink as sink_module

    monkeypatch.setattr(sink_module, "NativeRecorder", None)
    with pytest.raises(DeliveryLogError, match="not built"):
        DeliveryLog(str(tmp_path / "log"), fleet="f", device="d", node="n", firmware="1", native=True)
    monkeypatch.setattr(batch_module, "_decode_recorded", None)
    with pytest.raises(ValueError, match="lacks"):
        with_recorded([[] for _ in LANE_WIDTHS], b"\x02\x02")


@native
@pytest.mark.parametrize("process", [True, False], ids=["process", "thread"])
def test_native_and_pure_logs_hold_the_same_records(tmp_path, process):
    from appliance.broker.model import Message
    from appliance.protocol.packets import Properties

    logs = {}
    for name, use in (("native", True), ("pure", False)):
        logs[name] = DeliveryLog(str(tmp_path / name), fleet="f", device="d", node="n1", firmware="1", boot_id=BOOT,
                                 clock_synced=True, process=process, native=use, seq_property="n")
    assert logs["native"]._recorder is not None and logs["pure"]._recorder is None
    props = Properties(user_properties=[("n", "12")])
    for i in range(300):
        m = Message(f"n1-{i}", "plant/ü", b"x" * i, 1, i % 2 == 0, "pub", 0.0, properties=props)
        for log in logs.values():
            log.record_received(m.msg_id, m.publisher, m.topic, 1, m.retain, i, props.user_properties, i)
            log.emit("dropped", msg_id=m.msg_id, reason="queue_full") if i % 50 == 0 else None
            log.record_committed(m.msg_id)
            log.record_routed(m.msg_id, "s", "plant/#", 1)
            log.record_delivered(m.msg_id, "s", 1, False, 1)
            log.record_acked(m.msg_id, "s", 1)
            if i == 150:
                log.flush()
    for log in logs.values():
        log.close()

    def records(name):  # the clocks differ (two logs, one after the other): their order is what must hold
        return [{k: v for k, v in r.items() if k not in ("ts_wall_us", "ts_mono_us")}
                for r in read_segments(str(tmp_path / name), fill_nulls=False)]

    got, want = records("native"), records("pure")
    assert len(got) == 300 * 5 + 6 and got == want
    assert got[0]["publisher_seq"] == 12


@native
def test_beyond_its_limit_the_recorder_counts_events_instead_of_keeping_them():
    rec = NativeRecorder(LANE_WIDTHS, 3)
    for i in range(5):
        rec.committed(f"m{i}")
    assert len(rec) == 3 and rec.lost() == 2 and rec.lost() == 0
    lanes = with_recorded([[] for _ in LANE_WIDTHS], rec.take())
    assert lanes[2][1::2] == ["m0", "m1", "m2"]
    rec.committed("m5")  # room again after the take
    assert len(rec) == 1 and rec.lost() == 0
    with pytest.raises(ValueError, match="limit"):
        NativeRecorder(LANE_WIDTHS, -1)


@native
def test_a_log_whose_drain_stalls_keeps_bounded_memory_and_records_every_lost_event(tmp_path):
    log = DeliveryLog(str(tmp_path / "log"), fleet="f", device="d", node="n1", firmware="1", boot_id=BOOT,
                      clock_synced=True, native=True, max_backlog=5, flush_interval_s=30.0)
    for i in range(30):  # no drain in between: the recorder keeps 4 x 5, counts 10
        log.record_committed(f"m{i}")
    assert log.backlog == 20
    log.close()  # the drain keeps the newest 5 of the 20
    records = read_segments(str(tmp_path / "log"), fill_nulls=False)
    assert records[0]["kind"] == "log_evicted" and records[0]["reason"] == "backlog events=25"
    assert [r["msg_id"] for r in records[1:]] == [f"m{i}" for i in range(15, 20)]
