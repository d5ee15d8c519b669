"""The [cluster] configuration section: defaults, validation with one-line messages, secret_file."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.cli import main
from appliance.server.config import ConfigError, load


def _load(tmp_path: Path, body: str):
    path = tmp_path / "a.toml"
    path.write_text("[cluster]\n" + body)
    return load(path)


def test_defaults_keep_a_single_node_and_lossless_policies(tmp_path: Path) -> None:
    c = load(None).values["cluster"]
    assert c["enabled"] is False and c["replication_factor"] == 2 and c["under_replicated"] == "accept"
    assert all(c[k] for k in ("allow_register", "allow_publish", "allow_subscribe", "allow_unsubscribe"))
    ok = _load(tmp_path, 'enabled = true\nsecret = "s"\nseeds = ["10.0.0.2", "10.0.0.3:7000"]\n'
                         "heartbeat_interval = 0.5\n").values["cluster"]
    assert ok["seeds"] == ["10.0.0.2", "10.0.0.3:7000"] and ok["heartbeat_interval"] == 0.5


@pytest.mark.parametrize(("body", "message"), [
    ("enabled = true\n", "cluster.secret: a cluster needs secret or secret_file"),
    ('enabled = true\nsecret = "s"\nname = ""\n', "cluster.name: must not be empty"),
    ('seeds = ["a:b:c"]\n', "cluster.seeds: bad seed peer 'a:b:c'"),
    ('seeds = "10.0.0.1"\n', "cluster.seeds: expected a list of strings"),
    ("replication_factor = 0\n", "cluster.replication_factor: 0 is outside 1..5"),
    ('under_replicated = "maybe"\n', "cluster.under_replicated: 'maybe' is not one of accept, refuse"),
    ('bind = "nowhere"\n', "cluster.bind: expected HOST:PORT"),
    ("allow_publish = 1\n", "cluster.allow_publish: expected true or false"),
    ("failure_timeout = 0.5\nheartbeat_interval = 1.0\nenabled = true\nsecret = \"s\"\n",
     "cluster.failure_timeout: must exceed cluster.heartbeat_interval"),
    ('enabled = true\nsecret = "s"\ntls_ca = "/ca.pem"\n', "cluster.tls_ca: tls_ca, tls_cert and tls_key go together"),
    ("gossip = true\n", "cluster.gossip: unknown key"),
])
def test_bad_cluster_values_are_refused_with_the_key_named(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, body)
    assert str(err.value).startswith(message)


def test_run_refuses_an_empty_secret_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "cluster.secret"
    secret.write_text("\n")
    conf = tmp_path / "a.toml"
    conf.write_text(f'[node]\ndata_dir = "{tmp_path / "data"}"\n[listener]\ntcp = "127.0.0.1:0"\n'
                    f'[cluster]\nenabled = true\nsecret_file = "{secret}"\nbind = "127.0.0.1:0"\nmdns = false\n')
    assert main(["run", "--config", str(conf)]) == 2
    assert "cluster.secret_file" in capsys.readouterr().err


def test_cluster_show_without_an_address_is_a_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cluster", "show"]) == 2
    assert "metrics.http" in capsys.readouterr().err
