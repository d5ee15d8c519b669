"""Debian's mosquitto_pub / mosquitto_sub (3.1.1 and 5.0) against a running broker."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from tests.support.broker import BrokerProcess
from tests.support.procs import LineReader, finish, kill_hard

WAIT = 10
VERSIONS = {"v311": "mqttv311", "v5": "mqttv5"}
FORMAT = "MSG %r %q %t %p"  # retain flag, QoS, topic, payload


@pytest.fixture(params=sorted(VERSIONS))
def version(request: pytest.FixtureRequest) -> str:
    """The MQTT protocol version under test."""
    if shutil.which("mosquitto_sub") is None:
        pytest.fail("mosquitto-clients is not installed: run scripts/setup.sh")
    return str(request.param)


def common(broker: BrokerProcess, version: str) -> list[str]:
    """Host, port and protocol flags shared by both tools."""
    return ["-h", broker.host, "-p", str(broker.port), "-V", VERSIONS[version]]


def sub_proc(broker: BrokerProcess, version: str, *args: str) -> tuple[subprocess.Popen[str], LineReader]:
    """Start mosquitto_sub -d (line-buffered), wait for its SUBACK, return it with its line reader."""
    proc = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", "-d", *common(broker, version), "-F", FORMAT,
                             "-W", str(WAIT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = LineReader(proc)
    reader.wait_for("received SUBACK", WAIT)
    return proc, reader


def pub(broker: BrokerProcess, version: str, *args: str, stdin: str | None = None) -> None:
    """Run mosquitto_pub to completion and require exit code 0."""
    res = subprocess.run(["mosquitto_pub", *common(broker, version), *args], input=stdin, capture_output=True,
                         text=True, timeout=WAIT)
    assert res.returncode == 0, res.stderr


def topic(name: str) -> str:
    """A topic unique to one test."""
    return f"cli/{uuid.uuid4().hex[:8]}/{name}"


def test_qos0_and_qos1_lines_arrive_exactly(broker: BrokerProcess, version: str) -> None:
    t = topic("lines")
    proc, reader = sub_proc(broker, version, "-t", t, "-q", "1", "-C", "6")
    pub(broker, version, "-t", t, "-q", "0", "-l", stdin="zero-a\nzero-b\nzero-c\n")
    pub(broker, version, "-t", t, "-q", "1", "-l", stdin="one-a\none-b\none-c\n")
    got = reader.lines_starting("MSG ", 6, WAIT)
    assert finish(proc) == 0
    assert got == [f"0 0 {t} zero-{x}" for x in "abc"] + [f"0 1 {t} one-{x}" for x in "abc"]


def test_retained_message_goes_to_late_subscriber(broker: BrokerProcess, version: str) -> None:
    t = topic("retained")
    pub(broker, version, "-t", t, "-q", "1", "-r", "-m", "state=on")
    res = subprocess.run(["mosquitto_sub", *common(broker, version), "-t", t, "-q", "1", "-C", "1", "-W", str(WAIT),
                          "-F", FORMAT], capture_output=True, text=True, timeout=WAIT + 5)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"MSG 1 1 {t} state=on"]


def test_will_published_when_subscriber_process_is_killed(broker: BrokerProcess, version: str) -> None:
    will_topic = topic("will")
    watcher, watch_lines = sub_proc(broker, version, "-t", will_topic, "-q", "1", "-C", "1")
    doomed, _ = sub_proc(broker, version, "-t", topic("idle"), "--will-topic", will_topic, "--will-payload",
                         "gone", "--will-qos", "1", "-W", "60")
    kill_hard(doomed)  # [MQTT-3.1.2-8] connection lost without DISCONNECT: the will is published
    assert watch_lines.lines_starting("MSG ", 1, WAIT) == [f"0 1 {will_topic} gone"]
    assert finish(watcher) == 0


def test_persistent_session_receives_what_was_queued_offline(broker: BrokerProcess, version: str) -> None:
    t = topic("offline")
    ident = f"cli-{uuid.uuid4().hex[:8]}"
    session = ["-i", ident, "-c"] + (["-x", "300"] if version == "v5" else [])
    first, _ = sub_proc(broker, version, "-t", t, "-q", "1", *session)
    first.terminate()  # mosquitto_sub sends DISCONNECT on SIGTERM; the session stays
    finish(first)
    pub(broker, version, "-t", t, "-q", "1", "-l", stdin="m1\nm2\nm3\n")
    res = subprocess.run(["mosquitto_sub", *common(broker, version), "-t", t, "-q", "1", *session, "-C", "3", "-W",
                          str(WAIT), "-F", FORMAT], capture_output=True, text=True, timeout=WAIT + 5)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"MSG 0 1 {t} m{i}" for i in (1, 2, 3)]
