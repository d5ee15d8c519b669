"""Broker nodes as real `appliance run` processes, one per network namespace, plus MQTT clients run beside them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.netns import Lab, NodeProcess, wait_until

WAIT = 60.0
NAMES = "abcdefgh"
MQTT, METRICS, CPORT = 1883, 9883, 7946


class Cluster:
    """N broker nodes in a Lab; node i is named n<letter> and listens on its namespace's address."""

    def __init__(self, lab: Lab, n: int, secret: str = "lab-secret", **cluster: Any) -> None:
        self.lab = lab
        self.n = n
        self.procs: dict[int, NodeProcess] = {}
        self.secrets = {i: secret for i in range(n)}
        self.cluster = {"heartbeat_interval": 0.3, "failure_timeout": 1.5, "anti_entropy_interval": 1.0,
                        "mdns_ttl": 6, **cluster}

    def name(self, i: int) -> str:
        """Node name of node i."""
        return f"n{NAMES[i]}"

    def config(self, i: int) -> Path:
        """Write node i's TOML config; return its path."""
        assert self.lab.workdir is not None
        path = self.lab.workdir / f"{self.name(i)}.toml"
        c = {"enabled": True, "name": "e2e", "secret": self.secrets[i], **self.cluster}
        lines = ["[node]", f'name = "{self.name(i)}"', f'data_dir = "{self.lab.workdir / self.name(i)}"',
                 "[listener]", f'tcp = "0.0.0.0:{MQTT}"', "[metrics]", f'http = "0.0.0.0:{METRICS}"',
                 "sys_interval = 0", "[cluster]"]
        lines += [f"{k} = {json.dumps(v)}" for k, v in c.items()]
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, *nodes: int) -> None:
        """Start nodes (all when none named) and wait until their MQTT listeners answer."""
        for i in nodes or range(self.n):
            self.procs[i] = self.lab.spawn(i, [sys.executable, "-m", "appliance.cli", "run", "--config",
                                               str(self.config(i))], name=self.name(i))
        for i in nodes or range(self.n):
            wait_until(lambda i=i: "listening" in self.procs[i].output(), WAIT, f"{self.name(i)} listening")

    def kill(self, i: int) -> None:
        """SIGKILL node i."""
        self.lab.kill(self.procs[i])

    def stop(self, i: int) -> None:
        """SIGTERM node i and wait for it."""
        self.lab.signal(self.procs[i], signal.SIGTERM)
        self.procs[i].popen.wait(timeout=30)

    def status(self, i: int) -> dict[str, Any]:
        """Node i's GET /cluster JSON (fetched inside its namespace)."""
        out = self.lab.exec(i, sys.executable, "-m", "appliance.cli", "cluster", "show", "--json", "--metrics",
                            f"127.0.0.1:{METRICS}", check=False)
        if out.returncode != 0:
            return {}
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    def running_peers(self, i: int) -> set[str]:
        """Names node i reports as running (itself excluded)."""
        return {m["node"] for m in self.status(i).get("members", []) if m["state"] == "running"}

    def wait_formed(self, nodes: list[int] | None = None) -> None:
        """Wait until every listed node sees every other as running."""
        nodes = list(range(self.n)) if nodes is None else nodes
        for i in nodes:
            want = {self.name(j) for j in nodes if j != i}
            wait_until(lambda i=i, want=want: want <= self.running_peers(i), WAIT, f"{self.name(i)} sees {want}")

    def owner(self, i: int, client_id: str) -> str | None:
        """The owner of a client id's session as node i sees it."""
        return self.status(i).get("owners", {}).get(client_id)  # type: ignore[no-any-return]

    def crashes(self) -> list[str]:
        """Lines of every node log that show a crash or an unhandled error."""
        bad = []
        for p in self.lab.processes:
            for line in p.output().splitlines():
                if "Traceback" in line or " ERROR " in line or "CRITICAL" in line:
                    bad.append(f"{p.log_path.name}: {line}")
        return bad

    # -- clients (mosquitto tools inside a node's namespace) -----------------------------------------------------
    def pub(self, i: int, topic: str, messages: list[str], qos: int = 1, client_id: str | None = None,
            retain: bool = False, check: bool = True, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        """Publish lines (one message each) to node i with mosquitto_pub -l; returns once all are acked."""
        argv = ["mosquitto_pub", "-h", self.lab.ip(i), "-p", str(MQTT), "-t", topic, "-q", str(qos), "-l", *extra]
        if client_id:
            argv += ["-i", client_id]
        if retain:
            argv.append("-r")
        return _run_in(self.lab, i, argv, "\n".join(messages) + "\n", check)

    def sub(self, i: int, topic: str, client_id: str, count: int, timeout: int = 20, qos: int = 1,
            clean: bool = False) -> list[str]:
        """Subscribe on node i until `count` messages arrived or `timeout` s of silence; return the payloads."""
        argv = ["mosquitto_sub", "-h", self.lab.ip(i), "-p", str(MQTT), "-t", topic, "-q", str(qos), "-i",
                client_id, "-C", str(count), "-W", str(timeout)]
        if not clean:
            argv.append("-c")
        out = _run_in(self.lab, i, argv, None, False)
        return [line for line in out.stdout.splitlines() if line]

    def spawn_sub(self, i: int, topic: str, client_id: str, qos: int = 1, clean: bool = False,
                  extra: tuple[str, ...] = ()) -> NodeProcess:
        """A long-running subscriber on node i printing each payload."""
        argv = ["mosquitto_sub", "-h", self.lab.ip(i), "-p", str(MQTT), "-t", topic, "-q", str(qos), "-i",
                client_id, *extra]
        if not clean:
            argv.append("-c")
        return self.lab.spawn(i, argv, name=f"sub-{client_id}-")


def _run_in(lab: Lab, i: int, argv: list[str], stdin: str | None, check: bool) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", "netns", "exec", lab.ns(i), *argv], input=stdin, capture_output=True, text=True,
                          timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def lines(proc: NodeProcess) -> list[str]:
    """Payloads a spawned subscriber printed so far."""
    return [line for line in proc.output().splitlines() if line and not line.startswith("Error")]
