"""umqtt.simple and umqtt.robust under real MicroPython (Debian trixie chroot) against a running broker."""

from __future__ import annotations

import uuid

import pytest

from tests.support.broker import BrokerProcess
from tests.support.micropython import MicroPython
from tests.support.procs import LineReader, finish, kill_hard

WAIT = 20.0

# Shared MicroPython prelude: collect (topic, payload) pairs, poll with a bounded deadline, print results as MSG lines.
PRELUDE = """
import time
from umqtt.simple import MQTTClient
from umqtt.robust import MQTTClient as RobustClient
HOST, PORT = "127.0.0.1", {port}
got = []
def on_msg(topic, msg):
    got.append((topic, msg))
def collect(c, n, seconds=15):
    deadline = time.ticks_add(time.ticks_ms(), seconds * 1000)
    while len(got) < n and time.ticks_diff(deadline, time.ticks_ms()) > 0:
        if c.check_msg() is None:
            time.sleep_ms(5)
    for t, m in got:
        print("MSG", t.decode(), m.decode())
def make(cls, ident, **kw):
    c = cls(ident, HOST, port=PORT, keepalive=30, **kw)
    c.set_callback(on_msg)
    return c
"""


def script(broker: BrokerProcess, body: str) -> str:
    """A complete MicroPython program: the prelude bound to the broker's port, then body."""
    return PRELUDE.format(port=broker.port) + body


def run(mp: MicroPython, broker: BrokerProcess, body: str) -> list[str]:
    """Run a script to completion and return its MSG lines (prefix stripped)."""
    res = mp.run(script(broker, body), timeout=WAIT + 10, name=f"t-{uuid.uuid4().hex[:8]}.py")
    assert res.returncode == 0, res.stderr
    return [line[4:] for line in res.stdout.splitlines() if line.startswith("MSG ")]


def topic(name: str) -> str:
    """A topic unique to one test."""
    return f"umqtt/{uuid.uuid4().hex[:8]}/{name}"


@pytest.mark.parametrize("cls", ["MQTTClient", "RobustClient"])
def test_qos0_and_qos1_roundtrip(micropython: MicroPython, broker: BrokerProcess, cls: str) -> None:
    t = topic("rt")
    body = f"""
c = make({cls}, "mp-rt")
c.connect()
c.subscribe(b"{t}", qos=1)
for i in range(3):
    c.publish(b"{t}", b"zero-%d" % i, qos=0)
for i in range(3):
    c.publish(b"{t}", b"one-%d" % i, qos=1)
collect(c, 6)
c.disconnect()
"""
    got = run(micropython, broker, body)
    assert [g for g in got if "zero" in g] == [f"{t} zero-{i}" for i in range(3)]
    assert [g for g in got if "one" in g] == [f"{t} one-{i}" for i in range(3)]
    assert len(got) == 6


def test_retained_message_reaches_a_new_board(micropython: MicroPython, broker: BrokerProcess) -> None:
    t = topic("retained")
    body = f"""
p = make(MQTTClient, "mp-ret-pub")
p.connect()
p.publish(b"{t}", b"firmware=1.2.3", retain=True, qos=1)
p.disconnect()
s = make(MQTTClient, "mp-ret-sub")
s.connect()
s.subscribe(b"{t}", qos=1)
collect(s, 1)
s.disconnect()
"""
    assert run(micropython, broker, body) == [f"{t} firmware=1.2.3"]


def test_will_published_when_board_dies(micropython: MicroPython, broker: BrokerProcess) -> None:
    will_topic = topic("will")
    watcher = micropython.popen(script(broker, f"""
w = make(MQTTClient, "mp-watch")
w.connect()
w.subscribe(b"{will_topic}", qos=1)
print("ready")
collect(w, 1)
w.disconnect()
"""), name="watch.py")
    board = micropython.popen(script(broker, f"""
b = make(MQTTClient, "mp-board")
b.set_last_will(b"{will_topic}", b"board-offline", qos=1)
b.connect()
print("connected")
time.sleep(60)
"""), name="board.py")
    try:
        watch_lines = LineReader(watcher)
        watch_lines.wait_for("ready", WAIT)
        LineReader(board).wait_for("connected", WAIT)
    finally:
        kill_hard(board)  # [MQTT-3.1.2-8] lost without DISCONNECT: the will goes out
    try:
        assert watch_lines.lines_starting("MSG ", 1, WAIT) == [f"{will_topic} board-offline"]
    finally:
        finish(watcher)


def test_persistent_session_receives_what_was_queued_offline(micropython: MicroPython, broker: BrokerProcess) -> None:
    t = topic("offline")
    body = f"""
s = make(MQTTClient, "mp-persist")
s.connect(clean_session=True)
s.disconnect()
s = make(MQTTClient, "mp-persist")
s.connect(clean_session=False)
s.subscribe(b"{t}", qos=1)
s.disconnect()
p = make(MQTTClient, "mp-pub")
p.connect()
for i in range(4):
    p.publish(b"{t}", b"queued-%d" % i, qos=1)
p.disconnect()
s = make(MQTTClient, "mp-persist")
print("PRESENT", s.connect(clean_session=False))
collect(s, 4)
s.disconnect()
"""
    res = micropython.run(script(broker, body), timeout=WAIT + 10, name="persist.py")
    assert res.returncode == 0, res.stderr
    assert "PRESENT 1" in res.stdout.splitlines()  # [MQTT-3.2.2-2]
    assert [x[4:] for x in res.stdout.splitlines() if x.startswith("MSG ")] == [f"{t} queued-{i}" for i in range(4)]


def test_robust_client_reconnects_and_gets_what_was_queued(micropython: MicroPython, broker: BrokerProcess) -> None:
    t = topic("robust")
    body = f"""
s = make(MQTTClient, "mp-robust")
s.connect(clean_session=True)
s.disconnect()
r = make(RobustClient, "mp-robust")
r.DELAY = 0
r.connect(clean_session=False)
r.subscribe(b"{t}", qos=1)
r.sock.close()  # the link drops under it
p = make(MQTTClient, "mp-robust-pub")
p.connect()
for i in range(3):
    p.publish(b"{t}", b"during-outage-%d" % i, qos=1)
p.disconnect()
for _ in range(3):
    r.wait_msg()  # robust: the first read fails on the dead socket, reconnects with clean_session=False, receives
for tp, m in got:
    print("MSG", tp.decode(), m.decode())
r.disconnect()
"""
    assert run(micropython, broker, body) == [f"{t} during-outage-{i}" for i in range(3)]


def test_chroot_is_real_micropython(micropython: MicroPython) -> None:
    res = micropython.run("import sys\nprint(sys.implementation.name)\n", timeout=WAIT)
    assert res.stdout.strip() == "micropython", res.stderr

