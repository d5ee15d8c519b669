"""The brokers under comparison: how to configure, start (pinned to one core), scrape and stop each."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
APPLIANCE = REPO / ".venv" / "bin" / "appliance"
AMQTT_VENV = REPO / ".venv-amqtt"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
BROKER_CPU, LOADGEN_CPU = "0", "1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 60.0  # mosquitto writes its persistence file on SIGTERM
ALL = ("ours", "mosquitto", "mosquitto-nodrop", "amqtt")
# mosquitto's default max_queued_messages 1000 silently drops QoS1 messages for a slow subscriber (and caps what a
# persistent session keeps across a restart); 0 means "no limit". Measured here: `max_queued_messages 0` alone gives
# zero drops and the best QoS1 rate; adding `max_inflight_messages 0` also gives zero drops but was slower.
NODROP = "max_queued_messages 0\n"


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinning() -> bool:
    """True when there are at least two CPUs to split broker and load generator."""
    return shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2


def pinned(cpu: str, argv: list[str]) -> list[str]:
    """argv prefixed with `taskset -c cpu` when pinning is possible."""
    return ["taskset", "-c", cpu, *argv] if pinning() else argv


def unavailable(name: str) -> str | None:
    """Why broker name cannot run here, or None."""
    if name == "ours":
        if not APPLIANCE.exists():
            return f"{APPLIANCE} missing"
        res = subprocess.run([str(APPLIANCE), "run", "--help"], capture_output=True, text=True, timeout=60)
        return None if res.returncode == 0 else "`appliance run --help` fails (broker not ready yet)"
    if name.startswith("mosquitto"):
        return None if os.access(MOSQUITTO, os.X_OK) else "mosquitto not installed (scripts/setup.sh)"
    if name == "amqtt":
        return ensure_amqtt()
    return f"unknown broker {name!r}"


def ensure_amqtt() -> str | None:
    """Create .venv-amqtt with amqtt from PyPI if missing (its pins stay out of .venv); return an error or None."""
    exe = AMQTT_VENV / "bin" / "amqtt"
    if exe.exists():
        return None
    try:
        subprocess.run([sys.executable, "-m", "venv", str(AMQTT_VENV)], check=True, capture_output=True, timeout=120)
        subprocess.run([str(AMQTT_VENV / "bin" / "pip"), "install", "-q", "amqtt"], check=True, capture_output=True,
                       timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"could not install amqtt into {AMQTT_VENV}: {exc}"
    return None if exe.exists() else f"{exe} missing after install"


def _raise_nofile() -> None:
    """Child pre-exec: lift the open-files soft limit to the hard limit (5,000 idle sessions need it)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass
class Broker:
    """One broker process for one measurement."""

    name: str
    data_dir: Path
    persistent: bool = False
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def argv(self) -> list[str]:
        """Command line, writing any config file it needs into data_dir."""
        if self.name == "ours":
            return [str(APPLIANCE), "run", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir),
                    "--metrics", f"127.0.0.1:{self.metrics_port}", "--log-level", "WARNING"]
        if self.name.startswith("mosquitto"):
            conf = self.data_dir / "mosquitto.conf"
            text = (f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser root\n"
                    "log_dest stderr\nlog_type error\nlog_type warning\n")
            if self.persistent:
                text += f"persistence true\npersistence_location {self.data_dir}/\nautosave_interval 0\n"
            if self.name == "mosquitto-nodrop":
                text += NODROP
            conf.write_text(text)
            return [MOSQUITTO, "-c", str(conf)]
        if self.name == "amqtt":
            conf = self.data_dir / "amqtt.yaml"
            conf.write_text(
                "listeners:\n  default:\n    type: tcp\n"
                f"    bind: 127.0.0.1:{self.port}\n"
                "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n"
            )
            return [str(AMQTT_VENV / "bin" / "amqtt"), "-c", str(conf)]
        raise ValueError(self.name)

    def spawn(self) -> None:
        """Start the process pinned to the broker core, without waiting for it."""
        log = (self.data_dir / f"{self.name}.log").open("ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(pinned(BROKER_CPU, self.argv()), stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=_raise_nofile, cwd=self.data_dir, start_new_session=True)
        log.close()

    def start(self) -> None:
        """Spawn and wait (bounded) until the MQTT port accepts."""
        self.spawn()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not listen within {START_TIMEOUT} s: {self.log_tail()}")

    @property
    def pid(self) -> int:
        """The broker's pid (taskset execs, so it is the broker itself)."""
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM, wait (bounded), SIGKILL if needed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n: int = 15) -> str:
        """Last lines of the broker's output."""
        path = self.data_dir / f"{self.name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def scrape(self) -> dict[str, float]:
        """Our Prometheus counters and gauges (empty for other brokers or when the endpoint is absent)."""
        if self.name != "ours":
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s+([-+0-9.eE]+|NaN|[+-]Inf)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out


def store_figures(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Commit batch size and fsyncs/s over a workload, from our store counters (if the broker exports them)."""
    def delta(suffix: str) -> float | None:
        keys = [k for k in after if k.split("{")[0].endswith(suffix)]
        return sum(after[k] - before.get(k, 0.0) for k in keys) if keys else None

    commits, ops = delta("store_commits_total"), delta("store_ops_total")
    out: dict[str, float] = {}
    if commits is not None:
        out["fsyncs_per_s"] = commits / seconds if seconds > 0 else float("nan")
        if ops is not None:
            out["commit_batch_mean"] = ops / commits if commits else 0.0
    for k, v in after.items():
        if "commit_batch_size" in k and 'stat="max"' in k:
            out["commit_batch_max"] = v
    drops = delta("drops_total")
    if drops is not None:
        out["broker_drops"] = drops
    return out
