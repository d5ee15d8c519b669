"""`appliance store inspect` reports version, counts, queue depths and integrity; exits 2 on a bad store."""

from __future__ import annotations

import sqlite3

import pytest
from storehelpers import delivery, message, options, session

from appliance.broker.model import DeliveryState
from appliance.store import SqliteStore, StoreError, db_path
from appliance.store.inspect import inspect, main
from appliance.store.schema import latest_version


def populated(data_dir):
    store = SqliteStore(db_path(data_dir))
    store.open()
    store.save_session(session("deep"))
    store.save_session(session("shallow"))
    store.save_subscription("deep", "a/#", options())
    for seq in range(1, 8):
        store.enqueue("deep", delivery(seq, message(f"m{seq}")))
    store.update_delivery("deep", 1, DeliveryState.SENT, 1)
    store.enqueue("shallow", delivery(1, message("m1")))
    store.set_meta("node_id", "n1")
    store.close()
    return db_path(data_dir)


def test_report_lists_counts_and_queue_depths(tmp_path, capsys):
    populated(tmp_path)
    assert main(["inspect", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"schema version: {latest_version()}" in out
    assert "integrity (quick_check): ok" in out
    rows = {
        line.split()[0]: line.split()[1]
        for line in out.splitlines()
        if line.startswith("  ") and len(line.split()) == 2
    }
    assert rows == {
        "sessions": "2",
        "subscriptions": "1",
        "queue": "8",
        "retained": "0",
        "incoming_qos2": "0",
        "meta": "1",
    }
    deep = next(line for line in out.splitlines() if line.strip().startswith("deep"))
    assert deep.split()[3:6] == ["1", "7", "1"]  # subs, queued, inflight
    lines = out.splitlines()
    assert lines.index(deep) < next(i for i, line in enumerate(lines) if line.strip().startswith("shallow"))


def test_missing_store_exits_2(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path / "nowhere")]) == 2
    assert "no store file" in capsys.readouterr().err


def test_corrupt_store_exits_2_with_integrity_failure(tmp_path, capsys):
    path = populated(tmp_path)
    store = SqliteStore(path)
    for seq in range(8, 1500):
        store.enqueue("deep", delivery(seq, message(f"m{seq}", payload=b"x" * 300)))
    store.close()
    conn = sqlite3.connect(path)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'queue'").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * 4096 + 16)
        f.write(b"\xa5" * 4000)
    assert main(["--db", str(path), "--full"]) == 2
    err = capsys.readouterr().err
    assert "integrity (integrity_check): FAILED" in err


def test_inspect_does_not_create_a_file(tmp_path):
    with pytest.raises(StoreError, match="no store file"):
        inspect(tmp_path / "absent.sqlite3")
    assert not (tmp_path / "absent.sqlite3").exists()


def test_cli_store_inspect_subcommand(tmp_path, capsys):
    from appliance.cli import main as cli_main

    populated(tmp_path)
    assert cli_main(["store", "inspect", "--data-dir", str(tmp_path)]) == 0
    assert "queue          8" in capsys.readouterr().out
