"""The broker nodes under test: one node on loopback, or 3-5 clustered nodes in network namespaces (tests/harness).

Both offer the nemesis the same verbs: kill (SIGKILL) / start, stop (SIGSTOP) / cont, partition / heal_all, and start
the workload process where it can reach every node.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.netns import Lab, NodeProcess
from tests.support.broker import APPLIANCE, TRACEBACK_MARK, BrokerProcess, free_port

MQTT_PORT = 1883
PEER_PORT = 7946
METRICS_PORT = 9883
FLEET = "chaos"  # the clients' receipts use the same fleet, so Spark joins them with the brokers' logs
START_TIMEOUT = 30.0


def node_config(path: Path, deliverylog: bool, cluster: dict[str, object] | None = None) -> Path:
    """Write a node's TOML config: delivery log on or off, and the [cluster] section in multi-node mode."""
    lines = ["[node]", f'fleet = "{FLEET}"', "", "[deliverylog]", f"enabled = {'true' if deliverylog else 'false'}",
             "segment_seconds = 5", ""]
    lines += ["[metrics]", "sys_interval = 0", ""]
    if cluster is not None:
        lines.append("[cluster]")
        for key, value in cluster.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int | float):
                lines.append(f"{key} = {value}")
            elif isinstance(value, list):
                lines.append(f"{key} = [{', '.join(repr(str(v)).replace(chr(39), chr(34)) for v in value)}]")
            else:
                lines.append(f'{key} = "{value}"')
    path.write_text("\n".join(lines) + "\n")
    return path


class Nodes:
    """What the nemesis and the driver need from a set of broker nodes."""

    n: int
    workdir: Path

    def addresses(self) -> list[str]:
        """`host:port` of every node, index = node number."""
        raise NotImplementedError

    def kill(self, i: int) -> None:
        """SIGKILL node i."""
        raise NotImplementedError

    def start(self, i: int) -> None:
        """Start node i again on the same data dir and address; returns once it listens."""
        raise NotImplementedError

    def stop(self, i: int) -> None:
        """SIGSTOP node i."""
        raise NotImplementedError

    def cont(self, i: int) -> None:
        """SIGCONT node i."""
        raise NotImplementedError

    def partition(self, i: int, j: int) -> None:
        """Drop traffic between nodes i and j."""
        raise NotImplementedError

    def heal_all(self) -> None:
        """Undo every partition."""

    def alive(self, i: int) -> bool:
        """Node i's process exists (stopped counts as alive)."""
        raise NotImplementedError

    def spawn_workload(self, spec: Path, log: Path) -> tuple[subprocess.Popen[bytes], Path]:
        """Start the client process where it reaches every node; returns it and the file its output goes to."""
        raise NotImplementedError

    def log_texts(self) -> dict[str, str]:
        """Every node's log so far, by file name."""
        raise NotImplementedError

    def deliverylog_dirs(self) -> list[Path]:
        """Where the nodes wrote their delivery logs."""
        return [self.workdir / f"node{i}" / "deliverylog" for i in range(self.n)]

    def shutdown(self) -> None:
        """SIGCONT, then SIGTERM every node (flushes delivery logs), SIGKILL if it hangs."""
        raise NotImplementedError

    def close(self) -> None:
        """Release everything (idempotent)."""

    def problems(self) -> list[str]:
        """Tracebacks in the node logs (a crash logged anywhere fails the run)."""
        return [f"{name}: traceback logged" for name, text in self.log_texts().items() if TRACEBACK_MARK in text]


class LocalNode(Nodes):
    """One broker process on loopback (no namespaces needed): kill -9 / restart and SIGSTOP / SIGCONT."""

    def __init__(self, workdir: Path, deliverylog: bool) -> None:
        self.n = 1
        self.workdir = workdir
        data = workdir / "node0"
        data.mkdir(parents=True, exist_ok=True)
        config = node_config(workdir / "node0.toml", deliverylog)
        self.broker = BrokerProcess("ours", "127.0.0.1", free_port(), data, workdir / "node0.log",
                                    ("--config", str(config), "--node-name", "node0", "--metrics", ""))
        try:
            self.broker.start()
        except BaseException:  # interrupted while waiting for the port: never leave the process behind
            self.broker.kill()
            raise

    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{self.broker.port}"]

    def kill(self, i: int) -> None:
        self.broker.kill()

    def start(self, i: int) -> None:
        for attempt in range(20):  # the old socket may linger a moment after SIGKILL
            try:
                self.broker.start()
                return
            except RuntimeError as exc:
                if "in use" not in str(exc).lower() or attempt == 19:
                    raise
                time.sleep(0.25)

    def stop(self, i: int) -> None:
        os.kill(self.broker.pid, signal.SIGSTOP)

    def cont(self, i: int) -> None:
        os.kill(self.broker.pid, signal.SIGCONT)

    def partition(self, i: int, j: int) -> None:
        raise ValueError("a single node has no partitions")

    def alive(self, i: int) -> bool:
        return self.broker.proc is not None and self.broker.proc.poll() is None

    def spawn_workload(self, spec: Path, log: Path) -> tuple[subprocess.Popen[bytes], Path]:
        with log.open("wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "tests.chaos.workload", str(spec)], stdout=fh,
                                    stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
                                    start_new_session=True)
        return proc, log

    def log_texts(self) -> dict[str, str]:
        return {"node0.log": self.broker.log_text()}

    def shutdown(self) -> None:
        if self.alive(0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.broker.pid, signal.SIGCONT)
        self.broker.stop()

    def close(self) -> None:
        self.broker.kill()


class ClusterNodes(Nodes):
    """n clustered brokers, node i in namespace i of a Lab; the workload runs in an extra client namespace."""

    def __init__(self, workdir: Path, n: int, deliverylog: bool, cluster_name: str = "chaos") -> None:
        self.n = n
        self.workdir = workdir
        self.lab = Lab(n + 1, workdir=workdir)
        self.lab.up()
        self.procs: list[NodeProcess | None] = [None] * n
        secret = workdir / "cluster.secret"
        secret.write_text(secrets.token_hex(32) + "\n")
        secret.chmod(0o600)
        try:
            for i in range(n):
                (workdir / f"node{i}").mkdir(parents=True, exist_ok=True)
                node_config(workdir / f"node{i}.toml", deliverylog,
                            {"enabled": True, "name": cluster_name, "secret_file": str(secret), "mdns": True,
                             "bind": f"{self.lab.ip(i)}:{PEER_PORT}", "heartbeat_interval": 0.5,
                             "failure_timeout": 2.0})
            for i in range(n):  # all at once: each spends seconds announcing itself on mDNS before it listens
                self._spawn(i)
            for i in range(n):
                self._await_listening(i)
        except BaseException:
            self.close()
            raise

    def argv(self, i: int) -> list[str]:
        """The command line of node i."""
        return [str(APPLIANCE), "run", "--config", str(self.workdir / f"node{i}.toml"), "--listen",
                f"{self.lab.ip(i)}:{MQTT_PORT}", "--data-dir", str(self.workdir / f"node{i}"), "--node-name",
                f"node{i}", "--metrics", self.metrics(i)]

    def metrics(self, i: int) -> str:
        """Node i's metrics / status HTTP address (what `cluster show` asks)."""
        return f"{self.lab.ip(i)}:{METRICS_PORT}"

    def addresses(self) -> list[str]:
        return [f"{self.lab.ip(i)}:{MQTT_PORT}" for i in range(self.n)]

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.alive():
            if proc.stopped:
                self.lab.signal(proc, signal.SIGCONT)
            self.lab.kill(proc)

    def start(self, i: int) -> None:
        self._spawn(i)
        self._await_listening(i)

    def _spawn(self, i: int) -> None:
        self.procs[i] = self.lab.spawn(i, self.argv(i), name="broker")

    def _await_listening(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while "listening" not in proc.output():
            if not proc.alive():
                raise RuntimeError(f"node{i} exited at start:\n{proc.output()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"node{i} did not listen within {START_TIMEOUT}s:\n{proc.output()[-2000:]}")
            time.sleep(0.05)

    def stop(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.alive():
            self.lab.signal(proc, signal.SIGSTOP)

    def cont(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.alive():
            self.lab.signal(proc, signal.SIGCONT)

    def partition(self, i: int, j: int) -> None:
        self.lab.partition(i, j)

    def heal_all(self) -> None:
        self.lab.heal_all()

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.alive()

    def spawn_workload(self, spec: Path, log: Path) -> tuple[subprocess.Popen[bytes], Path]:
        proc = self.lab.spawn(self.n, [sys.executable, "-m", "tests.chaos.workload", str(spec)], name="workload")
        return proc.popen, proc.log_path

    def show(self, i: int = 0) -> subprocess.CompletedProcess[str]:
        """`appliance cluster show --json` run in node i's namespace."""
        return self.lab.exec(i, str(APPLIANCE), "cluster", "show", "--metrics", self.metrics(i), "--json",
                             check=False, timeout=30)

    def log_texts(self) -> dict[str, str]:
        return {p.log_path.name: p.output() for p in self.lab.processes if p.log_path.name.startswith("broker")}

    def shutdown(self) -> None:
        self.heal_all()
        for proc in self.procs:
            if proc is not None and proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.popen.wait(15)
                except subprocess.TimeoutExpired:
                    self.lab.kill(proc)

    def close(self) -> None:
        self.lab.down()
