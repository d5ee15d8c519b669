"""setup_logging: structured journald fields under systemd (real datagram socket), plain stderr otherwise."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent(
    """
    import logging, sys
    from appliance.server.systemd import setup_logging
    setup_logging("INFO", journal_socket=sys.argv[1])
    log = logging.getLogger("appliance.test")
    log.debug("hidden")
    log.warning("client %s dropped", "c1", extra={"client_id": "c1", "reason_code": 0x8D})
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("boom")
    """
)


def decode_native(data: bytes) -> dict[str, str]:
    """Decode journald's native datagram format (KEY=value lines, or KEY\\n<u64 len><bytes>\\n)."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            i = nl + 1
        else:
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            fields[line.decode()] = data[nl + 9 : nl + 9 + size].decode()
            assert data[nl + 9 + size : nl + 10 + size] == b"\n"
            i = nl + 10 + size
    return fields


def _run(env_extra: dict[str, str], journal: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "JOURNAL_STREAM")}
    env.update(env_extra, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-c", PROGRAM, journal], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_under_systemd_records_go_to_journald_with_fields(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    try:
        proc = _run({"INVOCATION_ID": "0123456789abcdef0123456789abcdef"}, path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""  # nothing on stderr: it all went to the journal
        first, second = decode_native(sock.recv(65536)), decode_native(sock.recv(65536))
        sock.settimeout(0.2)
        try:
            extra = sock.recv(65536)
        except TimeoutError:
            extra = b""
    finally:
        sock.close()
    assert extra == b""  # the DEBUG record was filtered by level
    assert first["MESSAGE"] == "client c1 dropped"
    assert first["PRIORITY"] == "4"
    assert first["SYSLOG_IDENTIFIER"] == "appliance"
    assert first["LOGGER"] == "appliance.test"
    assert (first["CLIENT_ID"], first["REASON_CODE"]) == ("c1", "141")
    assert first["CODE_FUNC"] == "<module>" and first["CODE_LINE"].isdigit()
    assert second["PRIORITY"] == "3"
    assert second["MESSAGE"].startswith("boom\nTraceback") and "ZeroDivisionError" in second["MESSAGE"]


def test_outside_systemd_plain_stderr(tmp_path: Path) -> None:
    proc = _run({}, str(tmp_path / "no-journal.sock"))
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    assert any(line.endswith("WARNING appliance.test: client c1 dropped") for line in lines), proc.stderr
    assert "hidden" not in proc.stderr and "ZeroDivisionError" in proc.stderr


def test_journal_stream_not_matching_stderr_means_stderr(tmp_path: Path) -> None:
    path = tmp_path / "journal.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        proc = _run({"JOURNAL_STREAM": "1:1"}, str(path))  # inherited from a parent, stderr redirected since
    finally:
        sock.close()
    assert "client c1 dropped" in proc.stderr
