"""Multi-node lab in network namespaces: a hub namespace holding a bridge, N node namespaces on veth pairs.

Every name carries the owning process id (`aplt<pid>-...`), so a run cleans up what a crashed earlier run left
behind without touching a lab another live run is using. Addresses (10.77.0.0/24 by default) exist only inside our
namespaces; the bridge lives in the hub namespace, so nothing is attached to the host's own interfaces.

    with Lab(3) as lab:
        p = lab.spawn(0, [sys.executable, "-m", "some.node"])
        lab.isolate(1); lab.rejoin(1)           # link down / up on node 1's veth
        lab.partition(0, 2); lab.heal(0, 2)     # nftables drop between two nodes
        lab.signal(p, signal.SIGSTOP)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "aplt"
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")
REPO = Path(__file__).resolve().parents[2]


def netns_unavailable() -> str | None:
    """Why namespace tests cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "network-namespace tests need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"network-namespace tests need `{tool}` (iproute2 / nftables)"
    return None


def _run(*argv: str, check: bool = True, timeout: float = 30, cwd: Path | None = None,
         env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, raising with its stderr on failure."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, input=stdin)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _pid_alive(pid: int) -> bool:
    """Whether a process exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in a namespace, then delete it."""
    pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "delete", ns, check=False)


def clean_leftovers() -> list[str]:
    """Delete namespaces left by runs whose process is gone; return their names."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.strip() else ""
        m = _OWNED.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace(ns)
            removed.append(ns)
    return removed


def owned(owner: int) -> frozenset[str]:
    """The namespaces process `owner` created (`aplt<owner>-...`) that exist now; none where `ip` is missing."""
    if shutil.which("ip") is None:
        return frozenset()
    names = (line.split()[0] for line in _run("ip", "netns", "list", check=False).stdout.splitlines() if line.strip())
    return frozenset(ns for ns in names if ns.startswith(f"{PREFIX}{owner}-"))


def remove_owned(owner: int, spare: frozenset[str] = frozenset()) -> list[str]:
    """Kill the processes in, and delete, every namespace process `owner` created (but those in spare)."""
    removed = sorted(owned(owner) - spare)
    for ns in removed:
        _kill_namespace(ns)
    return removed


@dataclass
class NodeProcess:
    """A process started inside one node's namespace, with its output captured to a file."""

    node: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    stopped: bool = False

    @property
    def pid(self) -> int:
        """The process id (`ip netns exec` execs the command, so this is the command itself)."""
        return self.popen.pid

    def output(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """Whether the process has not exited."""
        return self.popen.poll() is None

    def send(self, line: str) -> None:
        """Write one command line to the process's stdin (spawned with stdin=True)."""
        assert self.popen.stdin is not None, "spawned without stdin=True"
        self.popen.stdin.write(line.encode() + b"\n")
        self.popen.stdin.flush()


@dataclass
class Lab:
    """N network namespaces on one bridge; processes, signals, link failures and partitions; guaranteed teardown."""

    n: int
    subnet: str = "10.77.0"  # /24; node i gets .(i+1)
    workdir: Path | None = None
    owner: int = field(default_factory=os.getpid)
    processes: list[NodeProcess] = field(default_factory=list)
    _up: bool = False
    _split: set[int] = field(default_factory=set)  # nodes whose namespace holds the partition table
    _down: set[int] = field(default_factory=set)  # nodes whose link isolate() took down

    # -- names -------------------------------------------------------------------------------------------------
    @property
    def hub(self) -> str:
        """The namespace holding the bridge."""
        return f"{PREFIX}{self.owner}-hub"

    def ns(self, i: int) -> str:
        """Namespace name of node i."""
        return f"{PREFIX}{self.owner}-n{i}"

    def ip(self, i: int) -> str:
        """IPv4 address of node i."""
        return f"{self.subnet}.{i + 1}"

    def _veth_hub(self, i: int) -> str:
        return f"h{i}"  # names are per namespace: short and fixed

    # -- life cycle --------------------------------------------------------------------------------------------
    def __enter__(self) -> Lab:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Create the hub, the bridge and every node namespace with its veth pair, address and multicast route."""
        reason = netns_unavailable()
        if reason:
            raise RuntimeError(reason)
        clean_leftovers()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{self.owner}-"))
        self._up = True
        try:
            _run("ip", "netns", "add", self.hub)
            hub = ("ip", "-n", self.hub)
            _run(*hub, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
            _run(*hub, "link", "set", "lo", "up")
            _run(*hub, "link", "set", "br0", "up")
            for i in range(self.n):
                ns = self.ns(i)
                _run("ip", "netns", "add", ns)
                _run(*hub, "link", "add", self._veth_hub(i), "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run(*hub, "link", "set", self._veth_hub(i), "master", "br0", "up")
                node = ("ip", "-n", ns)
                _run(*node, "link", "set", "lo", "up")
                _run(*node, "addr", "add", f"{self.ip(i)}/24", "dev", "eth0")
                _run(*node, "link", "set", "eth0", "up", "multicast", "on")
                _run(*node, "route", "add", "224.0.0.0/4", "dev", "eth0")
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        """Kill every process we started (stopped ones too) and delete every namespace; safe to call twice."""
        for p in self.processes:
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.popen.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(timeout=10)
        if self._up:
            for i in range(self.n):
                _kill_namespace(self.ns(i))
            _kill_namespace(self.hub)
            self._up = False

    # -- processes ---------------------------------------------------------------------------------------------
    def spawn(self, i: int, argv: Sequence[str], env: dict[str, str] | None = None, name: str = "",
              stdin: bool = False) -> NodeProcess:
        """Start argv inside node i's namespace as a real process (cwd = repo root, output to a log file).

        With stdin=True the process reads commands written with NodeProcess.send().
        """
        assert self.workdir is not None
        log_path = self.workdir / f"{name or 'node'}{i}-{len(self.processes)}.log"
        full_env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(["ip", "netns", "exec", self.ns(i), *argv], stdout=log,
                                     stderr=subprocess.STDOUT, cwd=REPO, env=full_env, start_new_session=True,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL)
        proc = NodeProcess(i, popen, log_path)
        self.processes.append(proc)
        return proc

    def signal(self, proc: NodeProcess, sig: int) -> None:
        """Send SIGKILL / SIGSTOP / SIGCONT / SIGTERM to a process we started."""
        os.kill(proc.pid, sig)
        if sig == signal.SIGSTOP:
            proc.stopped = True
        elif sig == signal.SIGCONT:
            proc.stopped = False
        if sig == signal.SIGKILL:
            proc.popen.wait(timeout=10)

    def kill(self, proc: NodeProcess) -> None:
        """SIGKILL a process and reap it."""
        self.signal(proc, signal.SIGKILL)

    def exec(self, i: int, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a short command in node i's namespace (cwd = repo root) and wait for it."""
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return _run("ip", "netns", "exec", self.ns(i), *argv, check=check, timeout=timeout, cwd=REPO, env=env)

    # -- faults ------------------------------------------------------------------------------------------------
    def isolate(self, i: int) -> None:
        """Cut node i off from everyone: its veth goes down on the bridge side."""
        _run("ip", "-n", self.hub, "link", "set", self._veth_hub(i), "down")
        self._down.add(i)

    def rejoin(self, i: int) -> None:
        """Undo isolate(i)."""
        _run("ip", "-n", self.hub, "link", "set", self._veth_hub(i), "up")
        self._down.discard(i)

    def partition(self, i: int, j: int) -> None:
        """Drop all traffic between nodes i and j (nftables in both namespaces), multicast included."""
        table = f"{PREFIX}_split"
        for a, b in ((i, j), (j, i)):  # one atomic nft batch per namespace
            chains = [f"add chain inet {table} {hook} {{ type filter hook {hook} priority 0 ; policy accept ; }}"
                      for hook in ("input", "output")]
            script = [f"add table inet {table}", *chains,
                      f'add rule inet {table} input ip saddr {self.ip(b)} drop comment "peer{b}"',
                      f'add rule inet {table} output ip daddr {self.ip(b)} drop comment "peer{b}"']
            _run("ip", "netns", "exec", self.ns(a), "nft", "-f", "-", stdin="\n".join(script) + "\n")
            self._split.add(a)

    def heal(self, i: int, j: int) -> None:
        """Undo partition(i, j)."""
        for a, b in ((i, j), (j, i)):
            table = f"{PREFIX}_split"
            listing = self.exec(a, "nft", "-a", "list", "table", "inet", table, check=False).stdout
            for line in listing.splitlines():
                m = re.search(rf'comment "peer{b}" # handle (\d+)', line)
                if m:
                    chain = "input" if "saddr" in line else "output"
                    self.exec(a, "nft", "delete", "rule", "inet", table, chain, "handle", m.group(1))

    def heal_all(self) -> None:
        """Remove every partition and bring every node's link up (only partition / isolate change them)."""
        for i in sorted(self._split):
            self.exec(i, "nft", "delete", "table", "inet", f"{PREFIX}_split", check=False)
        self._split.clear()
        for i in sorted(self._down):
            self.rejoin(i)


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll `predicate()` until true; raise AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def lab(n: int, **kw: object) -> Iterator[Lab]:
    """Context manager form of Lab(n)."""
    with Lab(n, **kw) as running:  # type: ignore[arg-type]
        yield running
