"""Parquet segments: exact schema-v1 column types, encodings, journal -> Parquet on close, and crashes around it."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from appliance.deliverylog import DeliveryLog, read_segments
from appliance.deliverylog.columnar import ROW_GROUP_EVENTS
from appliance.deliverylog.segments import PART, closed_segments

from .conftest import BOOT, SAMPLES

ROOT = pathlib.Path(__file__).resolve().parents[2]
PARQUET_TYPES = {"string": "string", "int": "int32", "long": "int64", "boolean": "bool"}


def _log(directory, **kw):
    opts = dict(fleet="fleet-1", device="dev-1", node="n1", firmware="1.2.3", boot_id=BOOT, clock_synced=True,
                flush_interval_s=0.05, budget_bytes=1 << 30)
    opts.update(kw)
    return DeliveryLog(str(directory), **opts)


def _routed(log, start, n):
    for i in range(start, start + n):
        log.emit("routed", msg_id=f"m{i}", subscriber=f"s{i % 3}", filter="a/#", qos=1)


def test_parquet_columns_have_the_schema_types_and_nullability(tmp_path):
    log = _log(tmp_path / "log", strict=True)
    for kind, fields in SAMPLES.items():
        log.emit(kind, **fields)
    log.close()
    (name,) = closed_segments(str(tmp_path / "log"))
    assert name.endswith(".parquet")
    doc = json.loads((ROOT / "schema" / "deliverylog.v1.json").read_text())
    schema = pq.read_schema(tmp_path / "log" / name)
    assert [(f.name, str(f.type), f.nullable) for f in schema] == [
        (f["name"], PARQUET_TYPES[f["type"]], f["nullable"]) for f in doc["fields"]]
    meta = pq.ParquetFile(tmp_path / "log" / name).metadata
    column = meta.row_group(0).column(meta.schema.names.index("kind"))
    assert column.compression == "ZSTD"
    assert "RLE_DICTIONARY" in column.encodings
    table = pq.read_table(tmp_path / "log" / name)
    assert set(table["schema_version"].to_pylist()) == {doc["schema_version"]}
    assert table["kind"].to_pylist() == list(SAMPLES)


def test_row_groups_are_bounded_and_records_round_trip_in_order(tmp_path):
    log = _log(tmp_path / "log", segment_bytes=1 << 28, flush_interval_s=30.0)
    total = ROW_GROUP_EVENTS + 5000
    for start in range(0, total, 10_000):
        _routed(log, start, min(10_000, total - start))
        log.flush()
    log.close()
    (name,) = closed_segments(str(tmp_path / "log"))
    meta = pq.ParquetFile(tmp_path / "log" / name).metadata
    assert meta.num_rows == total and meta.num_row_groups == 2
    assert max(meta.row_group(i).num_rows for i in range(2)) <= ROW_GROUP_EVENTS
    records = read_segments(str(tmp_path / "log"), fill_nulls=False)
    assert [r["msg_id"] for r in records] == [f"m{i}" for i in range(total)]
    assert [r["event_id"] for r in records] == [f"n1:{BOOT}:{i}" for i in range(total)]
    assert "topic" not in records[0] and records[0]["filter"] == "a/#"


def test_values_the_column_type_cannot_hold_are_dropped_and_counted(tmp_path):
    log = _log(tmp_path / "log", process=False)
    log.emit("delivered", msg_id="m1", subscriber="s", qos="1", attempt=2**40)  # not strict: emit() trusts callers
    log.emit("delivered", msg_id="m2", subscriber="s", qos=1, attempt=1)
    log.close()
    first, second = read_segments(str(tmp_path / "log"))
    assert (first["msg_id"], first["qos"], first["attempt"]) == ("m1", None, None)
    assert (second["qos"], second["attempt"]) == (1, 1)
    assert log.stats().bad_fields == 2


def test_a_half_written_parquet_tmp_is_deleted_and_rebuilt_from_the_journal(tmp_path):
    """SIGKILL while the Parquet file is being written: any prefix of it may be on disk next to the journal."""
    src = tmp_path / "src"
    log = _log(src, segment_bytes=1 << 28, process=False)
    _routed(log, 0, 500)
    log.flush()
    (part,) = [n for n in os.listdir(src) if n.endswith(PART)]
    journal = (src / part).read_bytes()
    log.close()
    (final,) = closed_segments(str(src))
    complete = (src / final).read_bytes()
    expected = read_segments(str(src))
    for cut in (0, 4, len(complete) // 2, len(complete) - 1):
        crashed = tmp_path / f"crashed-{cut}"
        crashed.mkdir()
        (crashed / part).write_bytes(journal)
        (crashed / (final + ".tmp")).write_bytes(complete[:cut])
        shutil.copy(src / ".n1.state", crashed / ".n1.state")
        reopened = _log(crashed)
        assert reopened.stats().recovered == [f"{part}: 500 records kept, 0 B dropped"]
        reopened.close()
        assert sorted(os.listdir(crashed)) == sorted([".n1.lock", ".n1.state", final])
        assert read_segments(str(crashed)) == expected


def test_a_crash_after_the_rename_keeps_the_parquet_and_drops_the_journal(tmp_path):
    src = tmp_path / "src"
    log = _log(src, segment_bytes=1 << 28, process=False)
    _routed(log, 0, 300)
    log.flush()
    (part,) = [n for n in os.listdir(src) if n.endswith(PART)]
    journal = (src / part).read_bytes()
    log.close()
    (src / part).write_bytes(journal)  # as if killed between the rename and the journal's unlink
    reopened = _log(src)
    _routed(reopened, 300, 10)
    reopened.close()
    assert not [n for n in os.listdir(src) if n.endswith(PART)]
    assert [r["msg_id"] for r in read_segments(str(src))] == [f"m{i}" for i in range(310)]


def test_a_journal_left_in_jsonl_format_is_converted_when_the_format_is_parquet(tmp_path):
    log = _log(tmp_path / "log", format="jsonl.gz", segment_bytes=1 << 28, process=False)
    _routed(log, 0, 100)
    log.flush()
    (tmp_path / "crashed").mkdir()
    for name in os.listdir(tmp_path / "log"):  # the open journal as a crash would leave it
        shutil.copy(tmp_path / "log" / name, tmp_path / "crashed" / name)
    log.close()
    _log(tmp_path / "crashed").close()
    (name,) = closed_segments(str(tmp_path / "crashed"))
    assert name.endswith(".parquet")
    assert [r["msg_id"] for r in read_segments(str(tmp_path / "crashed"))] == [f"m{i}" for i in range(100)]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_sigkill_while_a_parquet_tmp_is_half_built_loses_nothing_flushed(tmp_path, mode):
    """Kill the emitting process (and its writer) once the segment's first row group is in the .parquet.tmp."""
    directory = tmp_path / "log"
    child = subprocess.Popen([sys.executable, "-m", "tests.deliverylog.crash_child", str(directory), "r0",
                              str(1 << 28), mode], start_new_session=True, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120

    def tmp_written():
        return directory.exists() and any(n.endswith(".parquet.tmp") for n in os.listdir(directory))

    try:
        while not tmp_written():
            assert child.poll() is None and time.monotonic() < deadline, "no row group was written in time"
            time.sleep(0.01)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    last = max(int(line) for line in child.stdout.read().splitlines())
    assert [n for n in os.listdir(directory) if n.endswith(".parquet.tmp")]
    assert [n for n in os.listdir(directory) if n.endswith(PART)]
    _log(directory).close()  # recovers: deletes the tmp, rebuilds the segment from the journal
    names = os.listdir(directory)
    assert not [n for n in names if n.endswith((".tmp", PART))]
    assert all(n.endswith(".parquet") for n in closed_segments(str(directory)))
    records = read_segments(str(directory))
    got = [int(r["msg_id"].split("-")[1]) for r in records]
    assert got == list(range(len(got))), "records are not a clean prefix"
    assert len(got) >= last + 1, f"flushed up to {last} but only {len(got)} records survived"
    assert len({r["event_id"] for r in records}) == len(records)


def test_after_warm_up_building_a_segment_imports_nothing_new(tmp_path):
    """The writer child warms Arrow up at start: its first batches must not pay for imports (pandas, kernels)."""
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from appliance.deliverylog.columnar import ParquetSegment, warm_up\n"
        "from appliance.deliverylog.identity import Identity\n"
        "warm_up()\n"
        "before = set(sys.modules)\n"
        f"seg = ParquetSegment({str(tmp_path / 'x.parquet')!r}, Identity('f', 'd', 'n', '1', 'b'), 0)\n"
        "flat = []\n"
        "for i in range(1000):\n"
        "    flat += ['received', 1, 1, (f'm{i}', 'p', 't', 1, False, 3, [('seq', str(i))], 7)]\n"
        "    flat += ['acked', 1, 1, (f'm{i}', 's', 1)]\n"
        "seg.add_flat(flat, True, 'seq')\n"
        "seg.flush_row_group()\n"
        "assert seg.finish() > 0\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_kinds_of_a_lanes_batch_read_back_in_emit_order_a_kind_outside_the_schema_included(tmp_path):
    """The kind column goes to Parquet as a dictionary over the schema's kinds; lane 0 may hold a kind outside it."""
    import marshal

    from appliance.deliverylog.identity import Identity
    from appliance.deliverylog.writer import Limits, SegmentWriter

    writer = SegmentWriter(str(tmp_path / "log"), Identity("fleet-1", "dev-1", "n1", "1.2.3", BOOT),
                           Limits(format="parquet", budget_bytes=1 << 30), lambda: True)
    mono = time.monotonic_ns()
    expected = []
    for known in (True, False):
        generic, routed, acked = [], [], []
        for i in range(6):
            mono += 1000
            if i % 3 == 0:
                kind = "peer_up" if known or i else "some_future_kind"
                generic += [kind, mono, {"peer_node": f"n{i}"}]
            elif i % 3 == 1:
                kind = "routed"
                routed += [mono, f"m{i}", "s1", "a/#", 1]
            else:
                kind = "acked"
                acked += [mono, f"m{i}", "s1", 1]
            expected.append(kind)
        writer.write_lanes_packed(marshal.dumps((0, False, [generic, [], [], routed, [], acked]), 4))
    writer.close()
    (name,) = closed_segments(str(tmp_path / "log"))
    assert pq.read_schema(tmp_path / "log" / name).field("kind").type == "string"
    assert pq.read_table(tmp_path / "log" / name)["kind"].to_pylist() == expected
