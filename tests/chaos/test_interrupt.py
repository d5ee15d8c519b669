"""An interrupted `python -m tests.chaos.run --jobs 2`: its nodes, clients and namespaces go, it exits non-zero."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.run import descendants, stop_worker
from tests.harness.netns import Lab, netns_unavailable, owned, remove_owned, wait_until
from tests.support.broker import ours_unavailable

REPO = Path(__file__).resolve().parents[2]


def _start_time(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat), None once it is gone (or a zombie): tells a reused pid
    apart."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    return ""


def _namespaces_of(pids: set[int]) -> list[str]:
    """Network namespaces named after one of pids (tests/harness/netns.py names them `aplt<owner pid>-...`)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    names = [line.split()[0] for line in listing.splitlines() if line.strip()]
    return [ns for ns in names if any(ns.startswith(f"aplt{pid}-") for pid in pids)]


@pytest.mark.parametrize(("jobs", "sig", "whole_group"),
                         [(2, signal.SIGTERM, False), (2, signal.SIGINT, True), (1, signal.SIGTERM, False)],
                         ids=["sigterm-to-runner", "ctrl-c-to-its-group", "one-job-sigterm"])
def test_an_interrupted_runner_leaves_no_node_client_or_namespace(tmp_path: Path, jobs: int, sig: int,
                                                                    whole_group: bool) -> None:
    """1-node runs (`jobs` at once), interrupted mid-traffic: every process the runner started is gone afterwards."""
    reason = ours_unavailable()
    if reason:
        pytest.skip(f"our broker is not runnable ({reason})")
    tmp = tmp_path / "tmp"  # the runs' work directories
    tmp.mkdir()
    argv = [sys.executable, "-m", "tests.chaos.run", "--runs", "4", "--jobs", str(jobs), "--nodes", "1", "--seed", "41",
            "--traffic-s", "120", "--drain-s", "10", "--out", str(tmp_path / "out")]
    runner = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: dict[int, str | None] = {}
    try:
        deadline = time.monotonic() + 240
        while True:  # every run under way: one broker and one workload each
            seen.update({pid: _start_time(pid) for pid in descendants(runner.pid)})
            lines = [_cmdline(pid) for pid in descendants(runner.pid)]
            if sum(" run --listen " in c for c in lines) == sum("tests.chaos.workload" in c for c in lines) == jobs:
                break
            assert runner.poll() is None and time.monotonic() < deadline, "runs did not get under way"
            time.sleep(0.2)
        seen.update({pid: _start_time(pid) for pid in descendants(runner.pid)})
        if whole_group:
            os.killpg(runner.pid, sig)
        else:
            runner.send_signal(sig)
        output, _ = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        left = [pid for pid, started in seen.items() if started is not None and _start_time(pid) == started]
        namespaces = _namespaces_of(set(seen))
        for pid in left:  # whatever the outcome, nothing this test started survives it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for ns in namespaces:
            subprocess.run(["ip", "netns", "delete", ns], check=False)
    assert not left, f"left running: {[(pid, _cmdline(pid)) for pid in left]}\n{output}"
    assert not namespaces, namespaces
    assert runner.returncode != 0, output
    assert "chaos totals: runs=0 failed_runs=0" in output and "(interrupted)" in output, output
    assert list(tmp.iterdir()) == [], output  # the unfinished runs' directories are gone too


def _lab_worker(workdir: Path) -> None:
    """A stand-in for a chaos run's worker: a lab of two nodes, a process in each, then nothing but waiting."""
    lab = Lab(2, workdir=workdir)
    lab.up()
    for i in range(2):
        lab.spawn(i, ["sleep", "600"], name="sleeper")
    (workdir / "ready").write_text("")
    time.sleep(600)


def test_stop_worker_ends_its_processes_and_deletes_its_namespaces_only(tmp_path: Path) -> None:
    """A worker frozen mid-run: its processes die and its hub (with the bridge) and node namespaces go; another
    owner's namespaces stay."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    ours = Lab(1, workdir=tmp_path)  # namespaces of another owner (this process), which must survive
    ours.up()
    worker = multiprocessing.get_context("fork").Process(target=_lab_worker, args=(tmp_path,))
    worker.start()
    try:
        wait_until(lambda: (tmp_path / "ready").exists(), 60, "the worker's lab")
        assert worker.pid is not None
        sleepers = {pid: _start_time(pid) for pid in descendants(worker.pid)}
        assert len(sleepers) == 2 and len(owned(worker.pid)) == 3  # two nodes and the hub
        stop_worker(worker.pid)
        worker.join(30)
        assert worker.exitcode == -signal.SIGKILL
        assert [pid for pid, started in sleepers.items() if _start_time(pid) == started] == []
        assert owned(worker.pid) == frozenset()
        assert owned(os.getpid()) == {ours.hub, ours.ns(0)}
    finally:
        if worker.exitcode is None:
            worker.kill()
            worker.join(10)
        if worker.pid is not None:
            remove_owned(worker.pid)  # only ever the worker's own namespaces
        ours.down()
