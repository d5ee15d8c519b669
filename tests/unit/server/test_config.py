"""config.load: defaults, file values, CLI overrides, one-line errors naming the key; defaults_toml round trip."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from appliance.broker.settings import BrokerSettings
from appliance.server.config import SPEC, ConfigError, defaults_toml, load, parse_hostport

DEFAULTS = {section: {key: spec.default for key, spec in keys.items()} for section, keys in SPEC.items()}


def keys_of(kind: type) -> list[tuple[str, str]]:
    """(section, key) of every key of one type."""
    return [(s, k) for s, keys in SPEC.items() for k, spec in keys.items() if spec.kind is kind]


# Keys that only make sense with others: the companions make `key = true` a valid configuration.
COMPANIONS = {
    ("listener", "ws_tls"): 'certfile = "c.pem"\nkeyfile = "k.pem"\n',
    ("cluster", "enabled"): 'secret = "s3cret"\n',
}


def write(tmp_path: Path, text: str) -> Path:
    """A config file holding `text`."""
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(path: Path | None, overrides: dict | None = None) -> str:
    """The ConfigError message of a refused load, checked to be one line."""
    with pytest.raises(ConfigError) as caught:
        load(path, overrides)
    message = str(caught.value)
    assert message and "\n" not in message
    return message


def test_no_file_gives_the_documented_defaults() -> None:
    config = load(None)
    assert config.values == DEFAULTS
    assert config.extra == {} and config.path is None
    assert config.data_dir == Path("./data")
    assert config.node_name  # the host name when node.name is empty


def test_default_broker_settings_match_the_broker_defaults() -> None:
    config = load(None)
    assert config.broker_settings() == BrokerSettings(node_id=config.node_name)


def test_file_values_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, '[node]\nname = "pi-7"\ndata_dir = "/var/lib/x"\n[limits]\nmax_inflight = 10\n'
                           'queue_full_policy = "refuse"\n[auth]\nallow_anonymous = false\n[upload]\nbucket = "b"\n')
    config = load(path, {"node": {"data_dir": "/srv/d"}, "listener": {"tcp": "0.0.0.0:1884"}})
    assert config.node_name == "pi-7"
    assert config.data_dir == Path("/srv/d")  # the flag wins over the file
    assert config.get("listener", "tcp") == "0.0.0.0:1884"
    assert config.get("limits", "receive_maximum") == 1024  # untouched keys keep their defaults
    assert config.extra["upload"] == {"bucket": "b"}  # sections owned by other components pass through
    settings = config.broker_settings()
    assert (settings.node_id, settings.max_inflight, settings.queue_full_policy, settings.allow_anonymous) == (
        "pi-7", 10, "refuse", False)
    expected = dataclasses.replace(BrokerSettings(), node_id="pi-7", max_inflight=10, queue_full_policy="refuse",
                                   allow_anonymous=False)
    assert settings == expected


@pytest.mark.parametrize(("section", "key"), keys_of(int))
def test_integer_bounds_are_inclusive_and_enforced(tmp_path: Path, section: str, key: str) -> None:
    spec = SPEC[section][key]
    assert spec.low is not None and spec.high is not None
    for ok in (spec.low, spec.high):
        assert load(write(tmp_path, f"[{section}]\n{key} = {ok}\n")).get(section, key) == ok
    for bad in (spec.low - 1, spec.high + 1, '"12"', "1.5", "true"):
        assert refused(write(tmp_path, f"[{section}]\n{key} = {bad}\n")).startswith(f"{section}.{key}: ")


@pytest.mark.parametrize(("section", "key"), keys_of(float))
def test_number_bounds_are_inclusive_and_enforced(tmp_path: Path, section: str, key: str) -> None:
    spec = SPEC[section][key]
    assert spec.low is not None and spec.high is not None
    for ok in (spec.low, spec.high):
        assert load(write(tmp_path, f"[{section}]\n{key} = {float(ok)!r}\n")).get(section, key) == ok
    for bad in (spec.low / 2 if spec.low > 0 else -1.0, spec.high + 1, '"1.0"', "true"):
        assert refused(write(tmp_path, f"[{section}]\n{key} = {bad}\n")).startswith(f"{section}.{key}: ")


@pytest.mark.parametrize(("section", "key"), keys_of(bool))
def test_booleans_accept_only_true_and_false(tmp_path: Path, section: str, key: str) -> None:
    companions = COMPANIONS.get((section, key), "")
    assert load(write(tmp_path, f"[{section}]\n{key} = true\n{companions}")).get(section, key) is True
    for bad in ("1", '"true"', "[]"):
        assert refused(write(tmp_path, f"[{section}]\n{key} = {bad}\n")).startswith(f"{section}.{key}: ")


@pytest.mark.parametrize(("section", "key"), keys_of(list))
def test_lists_hold_non_empty_strings(tmp_path: Path, section: str, key: str) -> None:
    for bad in ('"a"', "[1]", '[""]'):
        assert refused(write(tmp_path, f"[{section}]\n{key} = {bad}\n")).startswith(f"{section}.{key}: ")


@pytest.mark.parametrize(("section", "key"), keys_of(str))
def test_strings_refuse_other_types(tmp_path: Path, section: str, key: str) -> None:
    for bad in ("5", "false", '["a"]', "{ x = 1 }"):
        assert refused(write(tmp_path, f"[{section}]\n{key} = {bad}\n")).startswith(f"{section}.{key}: ")


@pytest.mark.parametrize(("text", "needle"), [
    ("[limits]\nmax_inflight = 0\n", "limits.max_inflight: 0 is outside 1..65535"),
    ('[limits]\nqueue_full_policy = "drop"\n', "limits.queue_full_policy: 'drop' is not one of"),
    ("[auth]\nallow_anon = true\n", "auth.allow_anon: unknown key"),
    ("[limitz]\n", "unknown section [limitz]"),
    ("limits = 3\n", "limits: expected a table"),
    ("[limits.sub]\nx = 1\n", "limits.sub: unknown key"),
    ('[listener]\ntcp = "127.0.0.1"\n', "listener.tcp: expected HOST:PORT"),
    ('[listener]\nws = "h:65536"\n', "listener.ws: expected HOST:PORT"),
    ('[metrics]\nhttp = ":x"\n', "metrics.http: expected HOST:PORT"),
    ('[listener]\ntls = "127.0.0.1:8883"\ncertfile = "c.pem"\n', "listener.keyfile"),
    ("[listener]\nws_tls = true\n", "listener.certfile"),
    ("[limits\n", "invalid TOML"),
    ('[node]\nname = "a"\nname = "b"\n', "invalid TOML"),
])
def test_bad_values_are_named(tmp_path: Path, text: str, needle: str) -> None:
    assert needle in refused(write(tmp_path, text))


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    assert "no such file" in refused(tmp_path / "missing.toml")
    assert str(tmp_path) in refused(tmp_path)  # a directory
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"[node]\nname = \"\xff\xfe\"\n")
    assert refused(binary) == f"{binary}: not UTF-8 text (byte 15)"


def test_overrides_are_validated_like_the_file() -> None:
    assert refused(None, {"limits": {"max_inflight": 0}}).startswith("limits.max_inflight: ")
    assert refused(None, {"node": {"nme": "x"}}) == "node.nme: unknown key"


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:1883", ("127.0.0.1", 1883)),
    ("[::1]:8883", ("::1", 8883)),
    (":1883", ("0.0.0.0", 1883)),
    ("broker.local:0", ("broker.local", 0)),
])
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text, "x") == expected


@pytest.mark.parametrize("text", ["", "host", "host:", "host:-1", "host:65536", "host:1e3"])
def test_parse_hostport_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--listen: expected HOST:PORT"):
        parse_hostport(text, "--listen")


def test_defaults_toml_round_trips(tmp_path: Path) -> None:
    text = defaults_toml()
    assert tomllib.loads(text) == DEFAULTS
    assert load(write(tmp_path, text)).values == load(None).values


def test_defaults_toml_documents_every_key() -> None:
    lines = defaults_toml().splitlines()
    for section, keys in SPEC.items():
        start = lines.index(f"[{section}]")
        for key, spec in keys.items():
            at = next(i for i, line in enumerate(lines) if i > start and line.startswith(f"{key} = "))
            assert lines[at - 1] == f"# {spec.doc}", f"{section}.{key}"
