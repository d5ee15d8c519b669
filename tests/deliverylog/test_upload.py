"""`appliance upload` against a real S3-compatible server (moto's standalone server) on loopback, and a directory."""

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import boto3
import pytest
from botocore.config import Config

from appliance.deliverylog import DeliveryLog, read_segment, read_segments
from appliance.deliverylog.segments import closed_segments
from appliance.deliverylog.upload import main

from .conftest import BOOT
from .s3proxy import FaultyProxy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CREDS = ["--access-key-id", "testing", "--secret-access-key", "testing", "--region", "us-east-1"]
FAST = ["--max-attempts", "4", "--backoff-base", "0.02", "--backoff-max", "0.1", "--timeout", "5"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_server():
    """moto's standalone S3-compatible server as a separate process on a loopback port."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto server did not start") from None
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(30)


def _s3(port):
    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def bucket(s3_server):
    name = f"logs-{uuid.uuid4().hex[:12]}"
    _s3(s3_server).create_bucket(Bucket=name)
    return name


def _objects(port, bucket):
    """key -> body of every object in the bucket."""
    s3 = _s3(port)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def _write_segments(directory, events=3000, device="dev-1", fmt="parquet"):
    """Closed segments from a real DeliveryLog; returns {segment name: bytes}."""
    log = DeliveryLog(str(directory), fleet="fleet-1", device=device, node="n1", firmware="1", boot_id=BOOT,
                      clock_synced=True, segment_bytes=2048, budget_bytes=1 << 30, flush_interval_s=0.05, format=fmt)
    for i in range(events):
        log.emit("acked", msg_id=f"n1:{i}", subscriber=f"s{i % 9}", topic=f"t/{i % 13}")
        if i % 200 == 199:
            log.flush()
    log.close()
    return {n: (directory / n).read_bytes() for n in closed_segments(str(directory))}


def _expected_key(prefix, name, device="dev-1"):
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    return f"{prefix}/fleet=fleet-1/date={day}/device={device}/{name}"


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.gz"])
def test_one_shot_upload_ships_every_segment_under_its_hive_key_then_deletes_it(s3_server, bucket, tmp_path, capsys,
                                                                                fmt):
    segments = _write_segments(tmp_path / "log", fmt=fmt)
    before = read_segments(str(tmp_path / "log"))
    assert len(segments) > 3 and all(n.endswith("." + fmt) for n in segments)
    config = tmp_path / "appliance.toml"
    config.write_text(
        f'[upload]\nlog_dir = "{tmp_path / "log"}"\nendpoint = "http://127.0.0.1:{s3_server}"\n'
        f'bucket = "{bucket}"\nprefix = "/deliverylog/"\naccess_key_id = "testing"\nsecret_access_key = "testing"\n'
    )
    assert main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"upload: {len(segments)} uploaded" in out and "0 failed, 0 waiting" in out
    objects = _objects(s3_server, bucket)
    assert objects == {_expected_key("deliverylog", n): data for n, data in segments.items()}
    assert closed_segments(str(tmp_path / "log")) == []
    (tmp_path / "shipped").mkdir()
    shipped = []
    for key in sorted(objects):  # read back what the bucket holds, with the same reader
        local = tmp_path / "shipped" / key.rsplit("/", 1)[1]
        local.write_bytes(objects[key])
        shipped += read_segment(str(local)).records
    assert [r["event_id"] for r in shipped] == [r["event_id"] for r in before]
    assert _s3(s3_server).head_object(Bucket=bucket, Key=sorted(objects)[0])["ContentType"] == (
        "application/vnd.apache.parquet" if fmt == "parquet" else "application/gzip")
    assert main(["--config", str(config)]) == 0  # nothing left: a no-op
    assert "upload: 0 uploaded" in capsys.readouterr().out


def test_upload_retries_through_injected_server_errors(s3_server, bucket, tmp_path, capsys):
    segments = _write_segments(tmp_path / "log")
    fail = lambda n: n <= 3 or n % 3 == 0  # noqa: E731 - three failures in a row, then every third request
    with FaultyProxy(s3_server, should_fail=fail) as proxy:
        rc = main(["--log-dir", str(tmp_path / "log"), "--endpoint", proxy.url, "--bucket", bucket, "--prefix", "p",
                   *CREDS, *FAST])
    assert rc == 0
    assert proxy.failed >= 3
    assert "retry" in capsys.readouterr().out
    assert set(_objects(s3_server, bucket)) == {_expected_key("p", n) for n in segments}
    assert closed_segments(str(tmp_path / "log")) == []


def test_persistent_server_errors_fail_the_run_and_keep_every_segment(s3_server, bucket, tmp_path, capsys):
    segments = _write_segments(tmp_path / "log", events=800)
    with FaultyProxy(s3_server, should_fail=lambda n: True) as proxy:
        rc = main(["--log-dir", str(tmp_path / "log"), "--endpoint", proxy.url, "--bucket", bucket, *CREDS, *FAST])
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("appliance upload: error: ")
    assert " 500 " in err[0] or " 503 " in err[0]  # HEAD answers carry only the status
    assert sorted(closed_segments(str(tmp_path / "log"))) == sorted(segments)
    assert _objects(s3_server, bucket) == {}


def test_unreachable_endpoint_fails_cleanly_and_a_later_run_catches_up(s3_server, bucket, tmp_path, capsys):
    segments = _write_segments(tmp_path / "log", events=800)
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    rc = main(["--log-dir", str(tmp_path / "log"), "--endpoint", dead, "--bucket", bucket, *CREDS, *FAST])
    assert rc == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("appliance upload: error: ") and "Could not connect" in err[0]
    assert sorted(closed_segments(str(tmp_path / "log"))) == sorted(segments)
    rc = main(["--log-dir", str(tmp_path / "log"), "--endpoint", f"http://127.0.0.1:{s3_server}", "--bucket", bucket,
               "--prefix", "p", *CREDS, *FAST])
    assert rc == 0
    assert set(_objects(s3_server, bucket)) == {_expected_key("p", n) for n in segments}


def test_missing_bucket_is_a_permanent_one_line_error(s3_server, tmp_path, capsys):
    _write_segments(tmp_path / "log", events=300)
    rc = main(["--log-dir", str(tmp_path / "log"), "--endpoint", f"http://127.0.0.1:{s3_server}", "--bucket",
               "no-such-bucket-here", *CREDS, *FAST])
    assert rc == 1
    captured = capsys.readouterr()
    assert "retry" not in captured.out
    assert "NoSuchBucket" in captured.err and len(captured.err.strip().splitlines()) == 1


def test_a_mismatching_object_is_replaced_and_the_segment_kept_until_confirmed(s3_server, bucket, tmp_path):
    segments = _write_segments(tmp_path / "log", events=300)
    name = sorted(segments)[0]
    key = _expected_key("p", name)
    _s3(s3_server).put_object(Bucket=bucket, Key=key, Body=b"stale half-written object")
    args = ["--log-dir", str(tmp_path / "log"), "--endpoint", f"http://127.0.0.1:{s3_server}", "--bucket", bucket,
            "--prefix", "p", *CREDS, *FAST]
    assert main(args) == 0
    assert _objects(s3_server, bucket)[key] == segments[name]


def test_sigkill_during_upload_then_rerun_ships_each_segment_once_under_one_key(s3_server, bucket, tmp_path):
    segments = _write_segments(tmp_path / "log", events=6000)
    assert len(segments) >= 10
    with FaultyProxy(s3_server, delay=0.03) as proxy:  # slow enough for the kill to land mid-run
        args = [sys.executable, "-m", "appliance.deliverylog.upload", "--log-dir", str(tmp_path / "log"),
                "--endpoint", proxy.url, "--bucket", bucket, "--prefix", "p", *CREDS, *FAST]
        for _ in range(3):
            child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            assert child.stdout.readline().startswith(("uploaded", "already"))  # mid-run for sure
            time.sleep(random.uniform(0.0, 0.3))
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert 0 < len(closed_segments(str(tmp_path / "log"))) < len(segments), "kills must land mid-run"
        done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    objects = _objects(s3_server, bucket)
    assert objects == {_expected_key("p", n): data for n, data in segments.items()}  # one key each, none lost
    assert closed_segments(str(tmp_path / "log")) == []


def test_directory_target_is_idempotent_across_a_crash_before_delete(tmp_path, capsys):
    segments = _write_segments(tmp_path / "log", events=600, device="dev/7")
    dest = tmp_path / "dest"
    args = ["--log-dir", str(tmp_path / "log"), "--dest-dir", str(dest), "--prefix", "x"]
    assert main(args) == 0
    files = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert files == {_expected_key("x", n, device="dev%2F7"): data for n, data in segments.items()}
    name = sorted(segments)[1]
    (tmp_path / "log" / name).write_bytes(segments[name])  # as if the uploader died between upload and delete
    capsys.readouterr()
    assert main(args) == 0
    assert "already uploaded" in capsys.readouterr().out
    assert closed_segments(str(tmp_path / "log")) == []
    assert len([p for p in dest.rglob("*") if p.is_file()]) == len(segments)


def test_loop_mode_uploads_new_segments_and_stops_on_sigterm(tmp_path):
    (tmp_path / "log").mkdir()
    dest = tmp_path / "dest"
    child = subprocess.Popen([sys.executable, "-m", "appliance.deliverylog.upload", "--log-dir", str(tmp_path / "log"),
                              "--dest-dir", str(dest), "--loop", "--interval", "0.2"], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        segments = _write_segments(tmp_path / "staging", events=400)
        for name in segments:  # closed segments appear in the watched directory, as the writer's renames do
            os.rename(tmp_path / "staging" / name, tmp_path / "log" / name)
        deadline = time.monotonic() + 60
        while closed_segments(str(tmp_path / "log")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert closed_segments(str(tmp_path / "log")) == []
    finally:
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == 0
    assert len([p for p in dest.rglob("*.parquet")]) == len(segments)


@pytest.mark.parametrize(
    ("toml", "flags", "message"),
    [
        ("[upload]\nbucket = 'b'\nspeed = 3\n", [], "unknown key upload.speed"),
        ("[upload]\nbucket = 3\n", [], "upload.bucket must be str"),
        ("[upload\n", [], "not valid TOML"),
        ("", [], "no destination"),
        ("[upload]\nbucket = 'b'\n", ["--dest-dir", "/tmp/x"], "choose one destination"),
        ("[upload]\nbucket = 'b'\nmax_attempts = 0\n", [], "max_attempts must be >= 1"),
    ],
)
def test_bad_configuration_is_a_one_line_error_with_exit_2(tmp_path, capsys, toml, flags, message):
    (tmp_path / "log").mkdir()
    config = tmp_path / "c.toml"
    config.write_text(toml)
    assert main(["--config", str(config), "--log-dir", str(tmp_path / "log"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_missing_log_directory_is_reported(tmp_path, capsys):
    assert main(["--log-dir", str(tmp_path / "nope"), "--dest-dir", str(tmp_path / "d")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_second_uploader_on_the_same_directory_is_refused(tmp_path, capsys):
    import fcntl

    (tmp_path / "log").mkdir()
    with open(tmp_path / "log" / ".upload.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert main(["--log-dir", str(tmp_path / "log"), "--dest-dir", str(tmp_path / "d")]) == 1
    assert "another upload is running" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "log")


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ('[deliverylog]\ndir = "{root}/a"\n[node]\ndata_dir = "{root}/b"\n', "a"),
        ('[deliverylog]\ndir = ""\n[node]\ndata_dir = "{root}/b"\n', "b/deliverylog"),
    ],
)
def test_log_dir_defaults_to_where_the_broker_writes(tmp_path, sections, expected):
    from appliance.deliverylog.upload import _parser, load_config

    (tmp_path / expected).mkdir(parents=True)
    config = tmp_path / "appliance.toml"
    config.write_text(sections.format(root=tmp_path) + '[upload]\nbucket = "b"\n[cluster]\nname = "c"\n')
    assert load_config(_parser().parse_args(["--config", str(config)])).log_dir == str(tmp_path / expected)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".parquet"])
def test_an_unreadable_segment_is_set_aside_and_the_others_still_ship(tmp_path, capsys, suffix):
    segments = _write_segments(tmp_path / "log", events=600)
    bad = "0000000000_n1_" + BOOT + "_999999999999" + suffix
    (tmp_path / "log" / bad).write_bytes(b"PAR1 neither gzip nor a Parquet footer")
    args = ["--log-dir", str(tmp_path / "log"), "--dest-dir", str(tmp_path / "dest")]
    assert main(args) == 1
    assert f"unreadable segment {bad}" in capsys.readouterr().err
    assert len([p for p in (tmp_path / "dest").rglob("*.parquet")]) == len(segments)
    assert os.path.exists(tmp_path / "log" / (bad + ".bad"))
    assert main(args) == 0  # the next run is clean
