"""A filesystem that is really small (a 1 MiB tmpfs): the writer evicts to keep free space, never fails writes."""

import os
import subprocess

import pytest

from appliance.deliverylog import read_segments


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs mounted for the test (needs root, like the netns tests)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_low_free_space_evicts_oldest_segments_and_accounts_for_every_event(make_log, small_fs):
    (small_fs / "ballast").write_bytes(os.urandom(600 << 10))  # someone else's data on the same filesystem
    log = make_log(small_fs / "log", segment_bytes=16 << 10, budget_bytes=100 << 20, min_free_bytes=256 << 10)
    total = 12_000
    for i in range(total):
        log.emit("received", msg_id=os.urandom(6).hex(), publisher=f"c{i % 50}", topic=f"t/{i}", payload_size=i)
        if i % 500 == 499:
            log.flush()
    log.close()
    records = read_segments(str(small_fs / "log"), fill_nulls=False)
    reasons = [r["reason"] for r in records if r["kind"] == "log_evicted"]
    assert any(r.startswith("disk_free ") for r in reasons)
    assert not [r for r in reasons if r.startswith("write_error")]
    lost: set[int] = set()
    for reason in reasons:
        words = dict(w.split("=", 1) for w in reason.split()[1:])
        first = int(words["first_event"].rsplit(":", 1)[1])
        last = int(words["last_event"].rsplit(":", 1)[1])
        lost |= set(range(first, last + 1))
    kept = {int(r["event_id"].rsplit(":", 1)[1]) for r in records}
    assert kept.isdisjoint(lost)
    assert kept | lost == set(range(max(kept) + 1))
    assert sum(1 for r in records if r["kind"] == "received") < total  # our own events really were evicted
