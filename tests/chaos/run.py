"""Chaos runs: nodes + workload + nemesis, then the checker. `python -m tests.chaos.run --runs 1000 [--nodes 3]`.

Each run prints one summary line; a long run prints totals and keeps the failing runs' directories (node logs, client
records, receipts, delivery logs, nemesis log) under tests/chaos/out/ (git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import pickle
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Set
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from tests.harness.netns import owned, remove_owned

from .checker import COUNTS, ERRORS, Result, check
from .history import read_history
from .nemesis import Nemesis
from .nodes import ClusterNodes, LocalNode, Nodes
from .workload import Spec

OUT = Path(__file__).resolve().parent / "out"
READY_TIMEOUT = 45.0


@dataclass
class RunConfig:
    """One run's shape; the spec fields not listed keep workload.Spec's defaults."""

    nodes: int = 1
    traffic_s: float = 20.0
    drain_s: float = 30.0
    seed: int = 1
    deliverylog: bool = False
    nemesis: bool = True
    rate: float = 25.0
    qos1_publishers: int = 2
    qos2_publishers: int = 2
    subscribers: int = 3
    ops: tuple[str, ...] = ()  # nemesis operations (default: all that apply to the node count)


@dataclass
class Outcome:
    """What one run produced."""

    index: int
    config: RunConfig
    workdir: Path
    result: Result
    faults: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    workload: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        """The checker found no error and nothing crashed."""
        return self.result.valid and not self.problems

    def line(self) -> str:
        """The one summary line of this run."""
        faults = ",".join(f"{k}:{v}" for k, v in sorted(self.faults.items())) or "none"
        verdict = "PASS" if self.passed else "FAIL " + "; ".join(self.problems + [
            f"{k}: {', '.join(self.result.examples[k][:2])}" for k in ERRORS if self.result.counts[k]])
        return (f"chaos run {self.index} seed={self.config.seed} nodes={self.config.nodes} faults={faults} "
                f"{self.result.line()} wall={self.wall_s:.0f}s :: {verdict}")


def make_nodes(config: RunConfig, workdir: Path) -> Nodes:
    """One loopback node, or a cluster in namespaces."""
    if config.nodes == 1:
        return LocalNode(workdir, config.deliverylog)
    return ClusterNodes(workdir, config.nodes, config.deliverylog)


def _wait_ready(proc: Any, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if "READY" in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"workload exited {proc.returncode} before READY:\n{text[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"workload not READY within {timeout}s")


def run_once(config: RunConfig, workdir: Path, index: int = 1) -> Outcome:
    """Start nodes and clients, inject faults during the traffic phase, heal, drain, stop, check."""
    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(asdict(config), indent=2))
    rng = random.Random(config.seed)
    problems: list[str] = []
    faults: Counter[str] = Counter()
    workload: dict[str, Any] = {}
    nodes: Nodes | None = None
    proc = None
    phases: dict[str, float] = {}  # seconds since t0 at the end of each phase (phases.json)
    try:
        nodes = make_nodes(config, workdir)
        phases["nodes_up"] = time.monotonic() - t0
        spec = Spec(nodes=nodes.addresses(), out=str(workdir / "clients"), seed=config.seed,
                    traffic_s=config.traffic_s, drain_s=config.drain_s, rate=config.rate,
                    qos1_publishers=config.qos1_publishers, qos2_publishers=config.qos2_publishers,
                    subscribers=config.subscribers, subscriber_qos=[2, 2, 1])
        spec_path = workdir / "spec.json"
        spec_path.write_text(json.dumps(asdict(spec)))
        proc, log = nodes.spawn_workload(spec_path, workdir / "workload.log")
        _wait_ready(proc, log, READY_TIMEOUT)
        ready = time.monotonic()
        phases["ready"] = ready - t0
        nemesis = Nemesis(nodes, rng, ops=tuple(config.ops))
        if config.nemesis:
            nemesis.run(until=ready + config.traffic_s - 1.0)
        nemesis.heal()
        faults = nemesis.counts()
        phases["healed"] = time.monotonic() - t0
        (workdir / "nemesis.json").write_text(json.dumps(nemesis.log, indent=1))
        try:
            proc.wait(max(1.0, ready + config.traffic_s + config.drain_s + 30 - time.monotonic()))
        except Exception:
            proc.kill()
            proc.wait(10)
            problems.append("workload overran its deadline")
        phases["workload_done"] = time.monotonic() - t0
        text = log.read_text(errors="replace")
        done = [ln for ln in text.splitlines() if ln.startswith("DONE ")]
        if proc.returncode != 0 or not done:
            problems.append(f"workload exited {proc.returncode}: {text.strip().splitlines()[-1:]}")
        else:
            workload = json.loads(done[-1][5:])
    except Exception as exc:  # a harness failure fails the run, with its reason on the line
        problems.append(f"harness: {exc!r}"[:500])
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if nodes is not None:
            with contextlib.suppress(Exception):
                nodes.shutdown()
            problems += nodes.problems()
            for name, text in nodes.log_texts().items():
                (workdir / "logs").mkdir(exist_ok=True)
                (workdir / "logs" / name).write_text(text)
            nodes.close()
            phases["nodes_down"] = time.monotonic() - t0
    history = workdir / "clients" / "history.jsonl"
    result = check(read_history(history)) if history.exists() else Result()
    if not history.exists():
        problems.append("no client history")
    phases["checked"] = time.monotonic() - t0
    (workdir / "phases.json").write_text(json.dumps({k: round(v, 2) for k, v in phases.items()}))
    return Outcome(index, config, workdir, result, faults, problems, workload, time.monotonic() - t0)


@dataclass
class Totals:
    """Sums over many runs."""

    runs: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    failed: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    interrupted: bool = False

    def add(self, outcome: Outcome) -> None:
        """Count one run."""
        self.runs += 1
        self.counts.update(outcome.result.counts)
        self.faults.update(outcome.faults)
        self.wall_s += outcome.wall_s
        if not outcome.passed:
            self.failed.append(outcome)

    def line(self, nodes: int) -> str:
        """The totals line."""
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.faults.items()))
        return (f"chaos totals: runs={self.runs} failed_runs={len(self.failed)} nodes={nodes} "
                f"{' '.join(f'{k}={self.counts[k]}' for k in COUNTS)} faults: {faults or 'none'} "
                f"wall={self.wall_s:.0f}s")


def _settle(outcome: Outcome, out: Path, keep: bool, say: Any, totals: Totals) -> None:
    """Print and count one finished run; move a failing (or, with keep, any) run's directory under `out`."""
    say(outcome.line())
    totals.add(outcome)
    if outcome.passed and not keep:
        shutil.rmtree(outcome.workdir, ignore_errors=True)
        return
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = out / f"{'kept' if outcome.passed else 'failed'}-{stamp}-run{outcome.index}-seed{outcome.config.seed}"
    shutil.move(str(outcome.workdir), dest)
    outcome.workdir = dest
    if not outcome.passed:
        say(f"  kept logs in {dest}")


def run_many(configs: list[RunConfig], out: Path, keep: bool = False, say: Any = print, jobs: int = 1,
             stop_at: float | None = None) -> Totals:
    """Run each config in a fresh directory, `jobs` at a time; failing runs' directories are moved under `out`,
    others deleted. No run starts after monotonic time `stop_at`."""
    totals = Totals()
    out.mkdir(parents=True, exist_ok=True)
    if jobs > 1:
        totals.interrupted = run_parallel(configs, jobs, stop_at, lambda o: _settle(o, out, keep, say, totals))
        return totals
    for i, config in enumerate(configs, 1):
        if stop_at is not None and time.monotonic() >= stop_at:
            break
        workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{config.seed}-"))
        spare, spare_ns = descendants(os.getpid()), owned(os.getpid())  # what this process had before the run
        try:
            outcome = run_once(config, workdir, i)
        except (KeyboardInterrupt, SystemExit):  # run_once's own cleanup may itself have been cut short
            with _signals_ignored():
                for pid in kill_tree(os.getpid(), spare):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
                remove_owned(os.getpid(), spare_ns)
                shutil.rmtree(workdir, ignore_errors=True)
            totals.interrupted = True
            break
        _settle(outcome, out, keep, say, totals)
    return totals


_FORK = multiprocessing.get_context("fork")  # the worker starts with the harness already imported


def _spawn_worker(index: int, config: RunConfig) -> tuple[BaseProcess, Path]:
    """Start one run in a forked process: its own pid names its namespaces (tests/harness/netns.py), so runs at once
    never share a namespace, bridge or address space."""
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{config.seed}-"))
    (workdir / "job.json").write_text(json.dumps({"index": index, "config": asdict(config)}))
    sys.stdout.flush()
    proc = _FORK.Process(target=_work, args=(workdir, index, config), name=f"chaos-run-{index}")
    proc.start()
    return proc, workdir


def _work(workdir: Path, index: int, config: RunConfig) -> None:
    """A worker's body: output to runner.log, SIGTERM unwinds the run (its nodes and namespaces go), outcome pickled."""
    log = os.open(workdir / "runner.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the runner alone handles it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    outcome = run_once(config, workdir, index)
    (workdir / "outcome.pickle").write_bytes(pickle.dumps(outcome))


def _collect(index: int, config: RunConfig, proc: BaseProcess, workdir: Path) -> Outcome:
    """The outcome a worker pickled, or a failed run naming how the worker ended."""
    path = workdir / "outcome.pickle"
    if proc.exitcode == 0 and path.exists():
        outcome: Outcome = pickle.loads(path.read_bytes())
        path.unlink()
        return outcome
    log = workdir / "runner.log"
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
    return Outcome(index, config, workdir, Result(), problems=[f"harness: worker exited {proc.exitcode}: {tail}"])


def run_parallel(configs: list[RunConfig], jobs: int, stop_at: float | None, settle: Any) -> bool:
    """Keep `jobs` worker processes busy until every config ran (or `stop_at` passed); settle each outcome as it
    arrives. Interrupted (SIGTERM / Ctrl-C), it ends the runs under way itself (stop_worker: their processes and
    namespaces, nobody else's), counts no partial run and returns True."""
    pending = list(enumerate(configs, 1))
    pending.reverse()
    running: dict[int, tuple[RunConfig, BaseProcess, Path]] = {}
    try:
        while running or (pending and (stop_at is None or time.monotonic() < stop_at)):
            while pending and len(running) < jobs and (stop_at is None or time.monotonic() < stop_at):
                index, config = pending.pop()
                signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # a forked worker is tracked before
                try:  # an interruption is handled (the worker unblocks them itself)
                    running[index] = (config, *_spawn_worker(index, config))
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            time.sleep(0.2)
            for index in [i for i, (_, proc, _) in running.items() if proc.exitcode is not None]:
                config, proc, workdir = running.pop(index)
                proc.join()
                settle(_collect(index, config, proc, workdir))
    except (KeyboardInterrupt, SystemExit):
        return True
    finally:
        with _signals_ignored():  # a second signal must not cut the teardown short
            for _, proc, workdir in running.values():
                if proc.pid is not None:
                    stop_worker(proc.pid)
                proc.join(30)
                shutil.rmtree(workdir, ignore_errors=True)
    return False


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGTERM and SIGINT are ignored inside the block (and their handlers restored after it)."""
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def descendants(root: int) -> set[int]:
    """Every process below root (by parent pid, whatever its session or namespace), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(root: int, spare: Set[int] = frozenset()) -> set[int]:
    """SIGKILL every process below root but those in spare; each is frozen (SIGSTOP) first, until no new one
    appears, so none can start another meanwhile. Returns the pids killed."""
    frozen: set[int] = set()
    while new := descendants(root) - spare - frozen:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return frozen


def stop_worker(pid: int) -> None:
    """End a run's worker and everything it started: its nodes and clients (SIGKILL), its namespaces and bridge."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)  # it starts nothing more
    kill_tree(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    remove_owned(pid)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so every run's finally block stops its nodes and clients."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run many chaos runs; print one line each and the totals; exit 1 if any failed."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--nodes", type=int, default=1, choices=(1, 3, 4, 5))
    p.add_argument("--traffic-s", type=float, default=20.0)
    p.add_argument("--drain-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=None, help="first run's seed (default: time based)")
    p.add_argument("--rate", type=float, default=25.0, help="messages/s per publisher")
    p.add_argument("--deliverylog", action="store_true", help="nodes write delivery logs ([deliverylog] enabled)")
    p.add_argument("--no-nemesis", action="store_true")
    p.add_argument("--ops", default="", help="comma-separated nemesis ops (kill,stop,partition,isolate)")
    p.add_argument("--keep", action="store_true", help="keep passing runs' directories too")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own process, namespaces and bridge (default 1)")
    p.add_argument("--stop-after-s", type=float, default=None,
                   help="start no run after this many seconds; runs under way finish and are counted")
    args = p.parse_args(argv)
    if args.runs < 1 or args.jobs < 1:
        p.error("--runs and --jobs must be at least 1")
    seed0 = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    configs = [RunConfig(nodes=args.nodes, traffic_s=args.traffic_s, drain_s=args.drain_s, seed=seed0 + i,
                         deliverylog=args.deliverylog, nemesis=not args.no_nemesis, rate=args.rate,
                         ops=tuple(op for op in args.ops.split(",") if op))
               for i in range(args.runs)]
    t0 = time.monotonic()
    stop_at = None if args.stop_after_s is None else t0 + args.stop_after_s
    totals = run_many(configs, args.out, args.keep, lambda s: print(s, flush=True), args.jobs, stop_at)
    print(totals.line(args.nodes), flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"chaos batch: jobs={args.jobs} elapsed={time.monotonic() - t0:.0f}s runs_done={totals.runs} "
          f"of {args.runs}{' (interrupted)' if totals.interrupted else ''} load={load}", flush=True)
    if totals.failed:
        print(f"failed runs: {[o.index for o in totals.failed]} (logs under {args.out})")
    return 1 if totals.failed or totals.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
