"""spark-submit against a real standalone cluster (a master and two workers on loopback) gives local mode's results."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="localhost", SPARK_DAEMON_MEMORY="256m",
               SPARK_WORKER_DIR=str(tmp / "work"), SPARK_LOG_DIR=str(tmp / "logs"), PYSPARK_PYTHON=sys.executable,
               PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("standalone")
    env = _env(tmp)
    port, ui = _free_port(), _free_port()
    logs = []
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed at teardown
        logs.append(log)
        procs.append(subprocess.Popen([str(BIN / "spark-class"), *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=tmp))

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))
        for i in range(2):
            start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "900m", "--webui-port", str(_free_port()), f"spark://127.0.0.1:{port}")
        deadline, alive = time.monotonic() + 120, 0
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    alive = json.load(r).get("aliveworkers", 0)
            except OSError:
                alive = 0
            if alive == 2:
                break
            assert all(p.poll() is None for p in procs), (tmp / "master.log").read_text()[-2000:]
            time.sleep(1)
        assert alive == 2, "the standalone cluster did not come up with two workers"
        yield {"master": f"spark://127.0.0.1:{port}", "ui": f"http://127.0.0.1:{ui}/json/", "env": env, "tmp": tmp}
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()


def test_spark_submit_on_a_standalone_cluster_matches_local_mode(spark: Any, generated: dict[str, Any],
                                                                    cluster: dict[str, Any]) -> None:
    tmp: Path = cluster["tmp"]
    package = tmp / "cloud_spark.zip"
    with zipfile.ZipFile(package, "w") as zf:
        for f in (REPO / "cloud_spark").rglob("*.py"):
            zf.write(f, f.relative_to(REPO))
    entry = tmp / "cloud_spark_main.py"
    shutil.copyfile(REPO / "cloud_spark" / "__main__.py", entry)
    out = tmp / "cluster-run"
    grace_s = str(generated["spec"].grace_us / 1e6)
    cmd = [str(BIN / "spark-submit"), "--master", cluster["master"], "--py-files", str(package),
           "--driver-memory", "768m", "--executor-memory", "512m", "--total-executor-cores", "2",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
           str(entry), "run", generated["src"], str(out), "--grace-s", grace_s]
    done = subprocess.run(cmd, env=cluster["env"], cwd=tmp, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    with urllib.request.urlopen(cluster["ui"], timeout=10) as r:
        apps = json.load(r)["completedapps"]
    assert [a["name"] for a in apps] == ["cloud_spark-run"]  # it really ran on the cluster
    remote = json.loads((out / "summary.json").read_text())
    assert remote == generated["summary"]
    cols = ["fleet", "msg_id", "subscriber", "fate", "reason", "deliveries", "e2e_fate", "routed_us", "node"]
    local_fate = spark.read.parquet(f"{generated['out']}/fate").select(*cols)
    assert_df_equality(spark.read.parquet(f"{out}/fate").select(*cols), local_fate, ignore_row_order=True)
    late_cols = ["fleet", "publisher", "subscriber", "msg_id", "displacement", "late_by_us"]
    assert_df_equality(spark.read.parquet(f"{out}/late").select(*late_cols),
                       spark.read.parquet(f"{generated['out']}/late").select(*late_cols), ignore_row_order=True)
    assert (out / "report" / "index.html").exists()
