"""Notifier against a real notify socket: READY, STATUS, watchdog pings on schedule and silent while the loop blocks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from appliance.server.systemd import Notifier

from .conftest import NotifySocket

WATCHDOG_USEC = 400_000  # pings expected every 0.2 s
HEALTHY_S, BLOCKED_S, RESUMED_S = 1.6, 1.2, 0.8

PROGRAM = textwrap.dedent(
    f"""
    import asyncio, sys, time
    from appliance.server.systemd import Notifier

    async def main():
        n = Notifier.from_env(backend=sys.argv[1])
        n.notify("X_PHASE=starting")
        await asyncio.sleep(0.3)          # the store opening: no READY yet
        n.ready("serving")
        n.async_start_watchdog()
        n.async_start_status(lambda: "3 clients, 0 queued", interval=0.5)
        await asyncio.sleep({HEALTHY_S})
        n.notify("X_PHASE=block")
        time.sleep({BLOCKED_S})           # a stalled event loop
        n.notify("X_PHASE=unblock")
        await asyncio.sleep({RESUMED_S})
        n.stopping()
        await n.async_close()

    asyncio.run(main())
    """
)


def _run(program: str, env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, "-c", program, *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("backend", ["systemd-python", "socket"])
def test_ready_then_pings_which_stop_while_loop_blocked(notify_socket: NotifySocket, backend: str) -> None:
    proc = _run(PROGRAM, {"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)}, backend)
    assert proc.returncode == 0, proc.stderr
    notify_socket.wait_for("STOPPING=1")
    lines = [line for _, line in notify_socket.lines()]
    timed = notify_socket.lines()

    # Order: nothing claims readiness before start-up is done; pings only after READY; STOPPING last.
    assert lines[0] == "X_PHASE=starting"
    assert lines.index("READY=1") < lines.index("WATCHDOG=1")
    assert "STATUS=serving" in lines and "STATUS=3 clients, 0 queued" in lines
    assert lines.index("STOPPING=1") > max(i for i, line in enumerate(lines) if line == "WATCHDOG=1")

    ready, block, unblock = lines.index("READY=1"), lines.index("X_PHASE=block"), lines.index("X_PHASE=unblock")
    healthy_pings = lines[ready:block].count("WATCHDOG=1")
    expected = HEALTHY_S / (WATCHDOG_USEC / 2e6)  # 10
    assert expected / 2 <= healthy_pings <= expected * 2 + 2, healthy_pings  # on schedule, loosely
    # While the loop is blocked for longer than WatchdogSec, no ping leaves: systemd would restart us.
    assert lines[block:unblock].count("WATCHDOG=1") == 0
    assert timed[unblock][0] - timed[block][0] > WATCHDOG_USEC / 1e6
    assert lines[unblock:].count("WATCHDOG=1") >= 2  # and they resume once the loop runs again

    # NotifyAccess=main: every datagram comes from the service's main process itself.
    assert {d.pid for d in notify_socket.received} == {proc_pid(notify_socket)}


def proc_pid(ns: NotifySocket) -> int:
    """The single sender pid seen (the child), failing if credentials were missing."""
    pids = {d.pid for d in ns.received}
    assert len(pids) == 1 and -1 not in pids, pids
    return pids.pop()


def test_watchdog_for_another_pid_is_ignored(notify_socket: NotifySocket) -> None:
    program = PROGRAM.replace("time.sleep", "(lambda s: None)")
    proc = _run(program, {"NOTIFY_SOCKET": notify_socket.address, "WATCHDOG_USEC": str(WATCHDOG_USEC),
                          "WATCHDOG_PID": "1"}, "socket")
    assert proc.returncode == 0, proc.stderr
    notify_socket.wait_for("STOPPING=1")
    lines = [line for _, line in notify_socket.lines()]
    assert "READY=1" in lines and "WATCHDOG=1" not in lines


def test_without_systemd_everything_is_a_noop() -> None:
    n = Notifier.from_env({})
    assert not n.enabled and n.watchdog_interval is None
    assert n.ready("x") is False and n.status("y") is False and n.stopping() is False
    assert n.sent == 0


def test_unreachable_socket_reports_failure(tmp_path: Path) -> None:
    n = Notifier(str(tmp_path / "missing.sock"), None, backend="socket")
    assert n.ready() is False
    n.close()


def test_status_is_one_line_and_nul_is_refused(notify_socket: NotifySocket) -> None:
    n = Notifier(notify_socket.address, None, backend="socket")
    assert n.status("a\nb  c")
    assert notify_socket.wait_for("STATUS=a b c")
    with pytest.raises(ValueError):
        n.notify("X=\0")
    n.close()
