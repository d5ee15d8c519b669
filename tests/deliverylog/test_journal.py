"""The binary journal of an open Parquet segment: truncated and corrupt frames are detected, good frames recovered."""

import marshal
import os
import shutil
import time

import pytest

from appliance.deliverylog import read_segment, read_segments
from appliance.deliverylog.identity import Identity
from appliance.deliverylog.journal import MAGIC, VARLEN, batch_frame, header, read_journal
from appliance.deliverylog.segments import PART, closed_segments
from appliance.deliverylog.writer import Limits, SegmentWriter

from .conftest import BOOT

BATCH = 40  # events per frame


def _writer(directory, fmt="parquet"):
    return SegmentWriter(str(directory), Identity("fleet-1", "dev-1", "n1", "1.2.3", BOOT),
                         Limits(format=fmt, budget_bytes=1 << 30), lambda: True)


def _journal(tmp_path, frames=4):
    """A writer left open after `frames` batches (odd ones lanes batches as DeliveryLog drains them, flagged LANES).

    Returns (part path, byte offset after each frame, msg ids, writer).
    """
    writer = _writer(tmp_path / "src")
    ends, ids = [], []
    now, mono = time.time_ns(), time.monotonic_ns()
    for f in range(frames):
        lanes = f % 2 == 1  # every other frame as DeliveryLog drains it: one lane per kind, values inline
        flat, received, routed = [], [], []
        for i in range(BATCH):
            msg_id = f"m{f}-{i}"
            values = (msg_id, f"s{i % 3}", "a/#", 1)
            mono += 1000
            routed += [mono, *values]
            flat += ["routed", now, mono, values]
            ids.append(msg_id)
        values = (f"r{f}", "pub", "a/b", 1, False, 5, [("seq", str(f))], 7)
        mono += 1000
        received += [mono, *values]
        flat += ["received", now, mono, values]
        ids.append(f"r{f}")
        if lanes:  # the lanes hold the kinds apart; emit order comes back from the clock
            writer.write_lanes_packed(marshal.dumps((now - mono, False, [[], received, [], routed, [], []]), 4))
        else:
            writer.write_flat(flat)
        (part,) = [n for n in os.listdir(tmp_path / "src") if n.endswith(PART)]
        ends.append(os.path.getsize(tmp_path / "src" / part))
    return tmp_path / "src" / part, ends, ids, writer


def test_a_journal_of_an_earlier_version_with_queued_batches_still_reads():
    """Frames flagged VARLEN (one interleaved queued batch, as versions before the lanes drained) decode in order."""
    queued = ["routed", 2000, "m1", "s", "a/#", 1, "node_start", 3000, {}, "committed", 4000, "m1"]
    data = header({"node": "n1"}, 5) + batch_frame(5, True, marshal.dumps((10**18, False, queued), 4), VARLEN)
    journal = read_journal(data)
    assert journal.complete and journal.events == 3
    assert journal.batches[0].flat == ["routed", 10**18 + 2000, 2000, ("m1", "s", "a/#", 1),
                                       "node_start", 10**18 + 3000, 3000, {},
                                       "committed", 10**18 + 4000, 4000, ("m1",)]


def _crashed(tmp_path, part, data):
    """A directory holding `data` as the part file and the source's state, as a crash would leave them."""
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / part.name).write_bytes(data)
    shutil.copy(part.parent / ".n1.state", crashed / ".n1.state")
    return crashed


def _recover(directory, fmt="parquet"):
    writer = _writer(directory, fmt)
    recovered = writer.stats.recovered
    writer.close()
    return recovered


def test_the_open_parquet_segment_is_a_binary_journal_readable_while_open(tmp_path):
    part, _, ids, writer = _journal(tmp_path)
    data = part.read_bytes()
    assert data.startswith(MAGIC)
    content = read_segment(str(part))
    assert content.complete and len(content.records) == len(ids)
    assert [r["msg_id"] for r in content.records] == ids
    assert [r["publisher_seq"] for r in content.records if r["kind"] == "received"] == [0, 1, 2, 3]
    writer.close()
    assert [r["msg_id"] for r in read_segments(str(tmp_path / "src"))] == ids


@pytest.mark.parametrize("cut", [1, 7, 20, -1])
def test_a_truncated_last_frame_is_detected_and_the_earlier_frames_kept(tmp_path, cut):
    part, ends, ids, writer = _journal(tmp_path)
    data = part.read_bytes()
    size = ends[2] + cut if cut > 0 else ends[3] + cut  # inside the fourth frame (its header, body or last byte)
    crashed = _crashed(tmp_path, part, data[:size])
    content = read_segment(str(crashed / part.name))
    assert not content.complete
    assert [r["msg_id"] for r in content.records] == ids[: 3 * (BATCH + 1)]
    assert _recover(crashed) == [f"{part.name}: {3 * (BATCH + 1)} records kept, {size - ends[2]} B dropped"]
    assert [r["msg_id"] for r in read_segments(str(crashed))] == ids[: 3 * (BATCH + 1)]
    assert not [n for n in os.listdir(crashed) if n.endswith((PART, ".tmp"))]
    writer.close()


def test_a_frame_with_a_bad_checksum_ends_the_good_records(tmp_path):
    part, ends, ids, writer = _journal(tmp_path)
    data = bytearray(part.read_bytes())
    data[(ends[0] + ends[1]) // 2] ^= 0x40  # one flipped bit in the second frame's body
    crashed = _crashed(tmp_path, part, bytes(data))
    content = read_segment(str(crashed / part.name))
    assert not content.complete and content.good_bytes == ends[0]
    assert [r["msg_id"] for r in content.records] == ids[: BATCH + 1]
    assert _recover(crashed) == [f"{part.name}: {BATCH + 1} records kept, {len(data) - ends[0]} B dropped"]
    (name,) = closed_segments(str(crashed))
    assert name.endswith(".parquet") and read_segment(str(crashed / name)).complete
    assert [r["msg_id"] for r in read_segments(str(crashed))] == ids[: BATCH + 1]
    writer.close()


def test_a_replayed_frame_is_out_of_sequence_and_dropped(tmp_path):
    """A frame whose first counter does not follow the previous frame's events (e.g. written twice) is damage."""
    part, ends, ids, writer = _journal(tmp_path, frames=2)
    data = part.read_bytes()
    crashed = _crashed(tmp_path, part, data + data[ends[0] : ends[1]])
    content = read_segment(str(crashed / part.name))
    assert not content.complete and content.good_bytes == len(data)
    assert [r["msg_id"] for r in content.records] == ids
    event_ids = [r["event_id"] for r in content.records]
    assert event_ids == [f"n1:{BOOT}:{i}" for i in range(len(ids))]
    writer.close()


def test_a_damaged_header_keeps_nothing_and_the_part_is_removed(tmp_path):
    part, _, _, writer = _journal(tmp_path, frames=1)
    data = bytearray(part.read_bytes())
    data[len(MAGIC) + 10] ^= 0x01  # inside the header frame's JSON
    crashed = _crashed(tmp_path, part, bytes(data))
    assert read_journal(bytes(data)).identity is None
    assert read_segment(str(crashed / part.name)).records == []
    assert _recover(crashed) == [f"{part.name}: 0 records kept, {len(data)} B dropped"]
    assert not closed_segments(str(crashed)) and not [n for n in os.listdir(crashed) if n.endswith(PART)]
    writer.close()


def test_a_binary_journal_is_recovered_as_jsonl_when_the_format_is_jsonl(tmp_path):
    part, _, ids, writer = _journal(tmp_path)
    crashed = _crashed(tmp_path, part, part.read_bytes())
    expected = read_segment(str(part)).records
    assert [r["msg_id"] for r in expected] == ids
    _recover(crashed, fmt="jsonl.gz")
    (name,) = closed_segments(str(crashed))
    assert name.endswith(".jsonl.gz")
    content = read_segment(str(crashed / name))
    assert content.complete and content.records == expected
    writer.close()
