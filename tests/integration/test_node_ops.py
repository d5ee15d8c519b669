"""Operating a node as a real `appliance` process: bad configs, busy ports, SIGTERM, metrics, $SYS, a corrupt or full
store, the passwd and config commands."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.protocol.packets import Disconnect, Properties, Puback, Publish
from appliance.protocol.reason_codes import ReasonCode
from appliance.server import config as node_config
from tests.support.broker import APPLIANCE, BrokerProcess, free_port, ours_unavailable, running_broker
from tests.support.raw import Closed, RawClient, v5

pytestmark = pytest.mark.skipif(ours_unavailable() is not None, reason=f"appliance not runnable: {ours_unavailable()}")

PERSIST = Properties(session_expiry_interval=3600)


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `appliance ARGS` to completion and capture its output."""
    return subprocess.run([str(APPLIANCE), *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused command (fails on a traceback or several lines)."""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {res.stderr!r}"
    return lines[0]


def broker_with(tmp: Path, toml: str, *extra: str) -> contextlib.AbstractContextManager[BrokerProcess]:
    """Our broker as a process with `toml` as its config file."""
    conf = tmp / "node.toml"
    conf.write_text(toml)
    return running_broker("ours", tmp / "data", ("--config", str(conf), *extra))


# -- configuration errors -------------------------------------------------------------------------------------------

BAD_CONFIGS = {
    "wrong-type": ('[limits]\nmax_inflight = "many"\n', "limits.max_inflight"),
    "wrong-bool": ('[auth]\nallow_anonymous = "yes"\n', "auth.allow_anonymous"),
    "out-of-range": ("[limits]\nmaximum_qos = 3\n", "limits.maximum_qos"),
    "negative": ("[metrics]\nsys_interval = -1\n", "metrics.sys_interval"),
    "bad-choice": ('[limits]\nqueue_full_policy = "drop"\n', "limits.queue_full_policy"),
    "unknown-key": ("[auth]\nallow_anon = true\n", "auth.allow_anon"),
    "unknown-section": ("[limitz]\nmax_inflight = 3\n", "[limitz]"),
    "section-not-table": ("limits = 3\n", "limits"),
    "bad-hostport": ('[listener]\ntcp = "127.0.0.1"\n', "listener.tcp"),
    "bad-port": ('[listener]\ntcp = "127.0.0.1:70000"\n', "listener.tcp"),
    "bad-metrics-bind": ('[metrics]\nhttp = "localhost:http"\n', "metrics.http"),
    "invalid-toml": ("[listener\ntcp = \n", "invalid TOML"),
    "tls-without-cert": ('[listener]\ntls = "127.0.0.1:8883"\n', "listener.certfile"),
    "missing-password-file": ('[auth]\npassword_file = "/nonexistent/pw"\n', "auth.password_file"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_value_exits_2_with_one_line_naming_the_key(tmp_path: Path, case: str) -> None:
    text, key = BAD_CONFIGS[case]
    conf = tmp_path / "bad.toml"
    conf.write_text(text)
    listen = () if key == "listener.tcp" else ("--listen", f"127.0.0.1:{free_port()}")  # --listen would override it
    res = cli("run", "--config", str(conf), *listen, "--data-dir", str(tmp_path / "d"), timeout=20)
    assert res.returncode == 2, res.stderr
    assert key in one_line_error(res)


@pytest.mark.parametrize(("args", "key"), [
    (("--config", "/nonexistent/node.toml"), "/nonexistent/node.toml"),
    (("--listen", "no-port-here"), "--listen"),
    (("--metrics", "127.0.0.1:port"), "metrics.http"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...], key: str) -> None:
    res = cli("run", "--data-dir", str(tmp_path / "d"), *args)
    assert res.returncode == 2, res.stderr
    assert key in one_line_error(res)


def test_config_that_is_not_utf8_exits_2_with_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "latin1.toml"
    conf.write_bytes(b'[node]\nname = "caf\xe9"\n')
    res = cli("run", "--config", str(conf), "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"),
              timeout=20)
    assert res.returncode == 2, res.stderr
    assert str(conf) in one_line_error(res) and "UTF-8" in one_line_error(res)


def test_acl_file_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("# comment\nuser alice\ntopic read a/#\ntopic sometimes b\n")
    conf = tmp_path / "node.toml"
    conf.write_text(f'[auth]\nacl_file = "{acl}"\n')
    res = cli("run", "--config", str(conf), "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"))
    assert res.returncode == 2, res.stderr
    line = one_line_error(res)
    assert str(acl) in line and "line 4" in line


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli("run", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"), timeout=30)
    assert res.returncode not in (0, None)
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "in use" in last and str(port) in last, res.stderr


# -- graceful shutdown ----------------------------------------------------------------------------------------------

def test_sigterm_disconnects_0x8b_exits_0_and_keeps_acked_messages(tmp_path: Path) -> None:
    with running_broker("ours", tmp_path) as broker:
        offline = RawClient(broker.port)  # 3.1.1 persistent subscriber, offline at SIGTERM
        offline.connect("term-offline", clean=False)
        offline.subscribe("term/t", 1)
        offline.disconnect()
        sub = v5(broker.port)  # v5 subscriber that received the message but has not acked it
        sub.connect("term-sub", properties=PERSIST)
        sub.subscribe("term/t", 1)
        old = RawClient(broker.port)
        old.connect("term-311")
        pub = v5(broker.port)
        pub.connect("term-pub")
        pub.publish("term/t", b"just-before", 1, packet_id=1)
        assert pub.expect(Puback).reason_code == ReasonCode.SUCCESS
        assert sub.expect(Publish).payload == b"just-before"

        assert broker.stop() == 0, broker.log_tail()
        for client in (pub, sub):
            got = client.expect_closed()
            assert got == [Disconnect(ReasonCode.SERVER_SHUTTING_DOWN)], got
        assert old.expect_closed() == []  # MQTT 3.1.1 has no server DISCONNECT: the connection just closes

        broker.start()
        again = RawClient(broker.port)
        assert again.connect("term-offline", clean=False).session_present
        assert [p.payload for p in again.collect(1)] == [b"just-before"]
        sub2 = v5(broker.port)
        assert sub2.connect("term-sub", clean=False, properties=PERSIST).session_present
        resent = sub2.expect(Publish)
        assert (resent.payload, resent.dup) == (b"just-before", True)  # [MQTT-4.4.0-1]
        for c in (again, sub2, pub, sub, old):
            c.close()



def test_sigterm_during_a_burst_loses_no_acknowledged_message(tmp_path: Path) -> None:
    with running_broker("ours", tmp_path) as broker:
        sub = RawClient(broker.port)
        sub.connect("burst-sub", clean=False)
        sub.subscribe("burst/t", 1)
        sub.disconnect()
        pub = v5(broker.port)
        pub.connect("burst-pub")
        pub.send(*(Publish("burst/t", b"%04d" % n, 1, packet_id=n) for n in range(1, 201)))
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)  # while the burst is being committed
        got = pub.expect_closed(20)
        acked = {p.packet_id for p in got if isinstance(p, Puback)}
        assert broker.stop() == 0, broker.log_tail()
        broker.start()
        again = RawClient(broker.port)
        assert again.connect("burst-sub", clean=False).session_present
        delivered: set[int] = set()
        while (packet := again.recv(1.0)) is not None:
            assert isinstance(packet, Publish), packet
            again.ack(packet)
            delivered.add(int(packet.payload))
        again.close()
    assert acked <= delivered, f"acknowledged but lost: {sorted(acked - delivered)[:20]}"
    if got[-1:] == [Disconnect(ReasonCode.SERVER_SHUTTING_DOWN)]:  # no RST ate the acks
        assert acked == delivered, f"{len(delivered - acked)} committed messages were not acknowledged"


# -- metrics --------------------------------------------------------------------------------------------------------

def scrape(port: int) -> dict[str, float]:
    """GET /metrics and return {'name{labels}': value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_prometheus_metrics_after_a_drop_scenario(tmp_path: Path) -> None:
    mport = free_port()
    toml = '[limits]\nmax_queued_messages = 2\nqueue_full_policy = "drop-oldest"\n'
    with broker_with(tmp_path, toml, "--metrics", f"127.0.0.1:{mport}") as broker:
        sub = RawClient(broker.port)
        sub.connect("m-sub", clean=False)
        sub.subscribe("m/t", 1)
        sub.disconnect()
        pub = RawClient(broker.port)
        pub.connect("m-pub")
        pub.publish("m/zero", b"z", 0)
        for n in range(1, 6):
            pub.publish("m/t", f"m{n}".encode(), 1, packet_id=n)
            assert pub.expect(Puback).packet_id == n
        m = scrape(mport)
        assert m["appliance_connections"] == 1
        assert m['appliance_messages_received_total{qos="0"}'] == 1
        assert m['appliance_messages_received_total{qos="1"}'] == 5
        assert m['appliance_messages_received_total{qos="2"}'] == 0
        assert m["appliance_queue_depth"] == 2
        assert m['appliance_drops_total{reason="queue_full_oldest"}'] == 3
        assert m["appliance_store_commits_total"] >= 1
        assert m['appliance_store_commit_batch_size{stat="max"}'] >= 1
        assert m['appliance_store_commit_latency_ms{stat="max"}'] > 0
        assert {'appliance_store_commit_latency_ms{stat="mean"}', 'appliance_store_commit_latency_ms{stat="p99"}',
                'appliance_store_commit_batch_size{stat="mean"}'} <= set(m)

        sub = RawClient(broker.port)
        sub.connect("m-sub", clean=False)
        assert [p.payload for p in sub.collect(2)] == [b"m4", b"m5"]
        assert sub.quiet(0.3) == []
        m = scrape(mport)
        assert m["appliance_connections"] == 2
        assert m['appliance_messages_sent_total{qos="1"}'] == 2
        assert m["appliance_queue_depth"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/status", timeout=10) as resp:
            assert b'"clients": 2' in resp.read()
        for junk in (b"GET /" + b"x" * 100_000 + b" HTTP/1.0\r\n\r\n", b"\xff\xfe\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", mport), timeout=10) as s:  # no traceback in the log for it
                s.sendall(junk)
                s.recv(1024)
        assert scrape(mport)["appliance_connections"] == 2
        sub.close()
        pub.close()


# -- $SYS -----------------------------------------------------------------------------------------------------------

def test_sys_topics_reach_sys_subscribers_but_not_hash(tmp_path: Path) -> None:
    with broker_with(tmp_path, "[metrics]\nsys_interval = 1\n") as broker:
        everything = RawClient(broker.port)
        everything.connect("sys-all")
        everything.subscribe("#", 0)
        plus = RawClient(broker.port)
        plus.connect("sys-plus")
        plus.subscribe("+/broker/#", 0)
        sys_sub = RawClient(broker.port)
        sys_sub.connect("sys-sub")
        sys_sub.subscribe("$SYS/#", 0)
        seen: dict[str, bytes] = {}
        deadline = time.monotonic() + 10
        while "$SYS/broker/store/commits" not in seen:  # the last figure of a round
            assert time.monotonic() < deadline, f"$SYS topics seen: {sorted(seen)}"
            packet = sys_sub.recv(1.0)
            if isinstance(packet, Publish):
                seen[packet.topic] = packet.payload
        for topic in ("version", "uptime", "clients/connected", "messages/received", "store/commits"):
            assert f"$SYS/broker/{topic}" in seen, sorted(seen)
        assert int(seen["$SYS/broker/clients/connected"]) >= 1
        pub = RawClient(broker.port)
        pub.connect("sys-pub")
        pub.publish("plain/topic", b"ordinary", 0)
        got = everything.collect(1)
        assert [(p.topic, p.payload) for p in got] == [("plain/topic", b"ordinary")]
        rounds = 0
        while rounds < 1:  # one more $SYS round, routed while "#" and "+/broker/#" were subscribed
            assert time.monotonic() < deadline + 10, "$SYS updates stopped"
            packet = sys_sub.recv(1.0)
            rounds += isinstance(packet, Publish) and packet.topic == "$SYS/broker/store/commits"
        assert [p for p in everything.quiet(0.5) if isinstance(p, Publish)] == []  # [MQTT-4.7.2-1]
        assert [p for p in plus.quiet(0.1) if isinstance(p, Publish)] == []
        for c in (everything, plus, sys_sub, pub):
            c.close()


# -- a corrupt or full store ----------------------------------------------------------------------------------------

def fill_queue(port: int, client_id: str, topic: str, count: int, size: int) -> None:
    """Leave `count` QoS1 messages of `size` bytes queued for an offline persistent subscriber."""
    sub = RawClient(port)
    sub.connect(client_id, clean=False)
    sub.subscribe(topic, 1)
    sub.disconnect()
    pub = RawClient(port)
    pub.connect(client_id + "-pub")
    pub.send(*(Publish(topic, bytes([n % 251]) * size, 1, packet_id=n) for n in range(1, count + 1)))
    assert [pub.expect(Puback).packet_id for _ in range(count)] == list(range(1, count + 1))
    pub.disconnect()


def test_corrupt_store_refuses_to_run_and_inspect_reports_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_broker("ours", data) as broker:
        fill_queue(broker.port, "corrupt-sub", "c/t", 300, 1024)
    db = data / "broker.db"
    wal = data / "broker.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "a clean stop checkpoints the WAL into broker.db"
    ok = cli("store", "inspect", "--data-dir", str(data))
    assert ok.returncode == 0, ok.stderr
    assert "corrupt-sub" in ok.stdout and "integrity (quick_check): ok" in ok.stdout
    page = 4096
    size = db.stat().st_size
    assert size > 40 * page
    with db.open("r+b") as f:  # scribble over a whole page in the middle of the file
        f.seek((size // page // 2) * page)
        f.write(bytes((i * 37 + 11) % 256 for i in range(page)))

    res = cli("run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data), timeout=60)
    assert res.returncode not in (0, 2), res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "store" in last and str(db) in last and re.search("corrupt|malformed", last), res.stderr
    report = cli("store", "inspect", "--data-dir", str(data))
    assert report.returncode != 0
    assert "Traceback" not in report.stderr
    assert "integrity" in report.stderr and "FAILED" in report.stderr, report.stderr


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` for the block (needs root)."""
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                         text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)



@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("persistent_publisher", [
    False,
    True,
])
def test_full_disk_stops_acknowledging_and_exits_with_a_clear_error(tmp_path: Path, persistent_publisher: bool) -> None:
    with small_tmpfs(tmp_path / "small", "1m") as data:
        broker = BrokerProcess("ours", "127.0.0.1", free_port(), data, tmp_path / "broker.log")
        broker.start()
        try:
            sub = RawClient(broker.port)
            sub.connect("full-sub", clean=False)
            sub.subscribe("full/t", 1)
            sub.disconnect()
            pub = RawClient(broker.port, timeout=5)
            pub.connect("full-pub", clean=not persistent_publisher)
            acked: list[bytes] = []
            for n in range(1, 200):
                payload = f"{n:05d}".encode() * 3200  # 16 KB
                try:
                    pub.publish("full/t", payload, 1, packet_id=n)
                    packet = pub.recv(5)
                except (Closed, OSError):
                    break
                if packet is None:
                    break
                assert isinstance(packet, Puback) and packet.packet_id == n, packet
                acked.append(payload)
            assert acked, "the disk filled before the first message"
            assert len(acked) < 199, "the tmpfs never filled up"
            with contextlib.suppress(Closed, OSError):  # after the failure: no acknowledgement ever again
                assert [p for p in pub.expect_closed(10) if isinstance(p, Puback)] == []
            assert broker.proc is not None
            code = broker.proc.wait(20)
        finally:
            broker.stop()
        log = broker.log_text()
        assert code not in (0, None), log
        assert "Traceback" not in log, log
        assert re.search(r"store failure.*(full|No space)", log), log
        # Nothing acknowledged was lost: the files left on the full disk, copied elsewhere, hold every acked message.
        rescue = tmp_path / "rescue"
        rescue.mkdir()
        for name in ("broker.db", "broker.db-wal"):
            if (data / name).exists():
                shutil.copy2(data / name, rescue / name)
    with running_broker("ours", rescue) as again:
        sub = RawClient(again.port)
        assert sub.connect("full-sub", clean=False).session_present
        got = [p.payload for p in sub.collect(len(acked), timeout=30)]
        assert got[: len(acked)] == acked
        sub.close()


# -- appliance passwd -----------------------------------------------------------------------------------------------

def users(path: Path) -> dict[str, str]:
    """user -> hash in a password file."""
    return dict(line.split(":", 1) for line in path.read_text().splitlines() if line)


def test_passwd_add_change_delete(tmp_path: Path) -> None:
    pw = tmp_path / "passwd"
    assert cli("passwd", str(pw), "alice", "--password-stdin", stdin="first\n").returncode == 0
    assert cli("passwd", str(pw), "bob", "--password-stdin", stdin="other\n").returncode == 0
    before = users(pw)
    assert sorted(before) == ["alice", "bob"] and before["alice"].startswith("scrypt$")
    assert pw.stat().st_mode & 0o777 == 0o600
    assert cli("passwd", str(pw), "alice", "--password-stdin", stdin="second\n").returncode == 0
    after = users(pw)
    assert after["alice"] != before["alice"] and after["bob"] == before["bob"]

    from appliance.broker.passwords import verify_password
    assert verify_password("second", after["alice"]) and not verify_password("first", after["alice"])
    res = cli("passwd", str(pw), "alice", "--delete")
    assert res.returncode == 0, res.stderr
    assert sorted(users(pw)) == ["bob"]
    missing = cli("passwd", str(pw), "alice", "--delete")
    assert missing.returncode != 0 and "alice" in one_line_error(missing)
    assert sorted(users(pw)) == ["bob"]


@pytest.mark.parametrize(("user", "password", "needle"), [
    ("bad:name", "pw", "bad:name"),
    ("carol", "", "empty password"),
])
def test_passwd_refuses_bad_input(tmp_path: Path, user: str, password: str, needle: str) -> None:
    pw = tmp_path / "passwd"
    res = cli("passwd", str(pw), user, "--password-stdin", stdin=password + "\n")
    assert res.returncode == 2
    assert needle in one_line_error(res)
    assert not pw.exists()


def test_passwd_io_errors_are_one_line(tmp_path: Path) -> None:
    nowhere = tmp_path / "no" / "such" / "dir" / "passwd"
    res = cli("passwd", str(nowhere), "alice", "--password-stdin", stdin="pw\n")
    assert res.returncode == 1
    assert str(nowhere) in one_line_error(res)
    res = cli("passwd", str(tmp_path), "alice", "--password-stdin", stdin="pw\n")  # a directory, not a file
    assert res.returncode == 1
    assert str(tmp_path) in one_line_error(res)


def test_bad_password_file_line_is_named_by_passwd_and_run(tmp_path: Path) -> None:
    pw = tmp_path / "passwd"
    assert cli("passwd", str(pw), "alice", "--password-stdin", stdin="pw\n").returncode == 0
    good = pw.read_text()
    pw.write_text(good + "# a comment\nmallory-without-a-hash\n")
    res = cli("passwd", str(pw), "bob", "--password-stdin", stdin="pw\n")
    assert res.returncode == 2
    line = one_line_error(res)
    assert str(pw) in line and "line 3" in line
    assert pw.read_text() == good + "# a comment\nmallory-without-a-hash\n"  # left untouched
    conf = tmp_path / "node.toml"
    conf.write_text(f'[auth]\npassword_file = "{pw}"\n')
    run = cli("run", "--config", str(conf), "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d"))
    assert run.returncode == 2
    line = one_line_error(run)
    assert str(pw) in line and "line 3" in line


# -- appliance config defaults --------------------------------------------------------------------------------------

def test_config_defaults_parse_load_back_and_run(tmp_path: Path) -> None:
    res = cli("config", "defaults")
    assert res.returncode == 0, res.stderr
    parsed = tomllib.loads(res.stdout)
    expected = {section: {key: spec.default for key, spec in keys.items()}
                for section, keys in node_config.SPEC.items()}
    assert parsed == expected
    path = tmp_path / "defaults.toml"
    path.write_text(res.stdout)
    assert node_config.load(path).values == node_config.load(None).values
    with running_broker("ours", tmp_path / "d", ("--config", str(path))) as broker:
        client = RawClient(broker.port)
        assert client.connect("defaults").reason_code == 0
        client.disconnect()
