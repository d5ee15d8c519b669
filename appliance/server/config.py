"""Node configuration: one TOML file with documented defaults, validated key by key into typed settings."""

from __future__ import annotations

import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.broker.settings import NEVER_EXPIRES, QUEUE_POLICIES, BrokerSettings
from appliance.cluster.discovery import parse_seeds


class ConfigError(ValueError):
    """A bad configuration value; str() is the one-line message the CLI prints before exiting with status 2."""


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its type, default, bounds and documentation."""

    kind: type
    default: Any
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None


U32 = 0xFFFFFFFF
SPEC: dict[str, dict[str, Key]] = {
    "node": {
        "name": Key(str, "", "node name, unique in the cluster (default: the host name)"),
        "data_dir": Key(str, "./data", "directory holding the SQLite store"),
        "fleet": Key(str, "default", "fleet this device belongs to (delivery logs)"),
        "device": Key(str, "", "device id (default: the host name)"),
        "firmware": Key(str, "", "firmware / image version reported in logs (default: the package version)"),
    },
    "listener": {
        "tcp": Key(str, "127.0.0.1:1883", "plain MQTT listener HOST:PORT, empty to disable"),
        "tls": Key(str, "", "MQTT over TLS listener HOST:PORT, empty to disable"),
        "ws": Key(str, "", "MQTT over WebSocket (subprotocol 'mqtt') listener HOST:PORT, empty to disable"),
        "ws_tls": Key(bool, False, "serve the WebSocket listener over TLS (wss)"),
        "certfile": Key(str, "", "TLS certificate chain (PEM)"),
        "keyfile": Key(str, "", "TLS private key (PEM)"),
        "cafile": Key(str, "", "CA bundle for verifying client certificates"),
        "require_client_cert": Key(bool, False, "TLS clients must present a certificate signed by cafile"),
        "use_identity_as_username": Key(bool, False, "a verified client certificate's CN authenticates as that user"),
    },
    "auth": {
        "allow_anonymous": Key(bool, True, "accept CONNECT without a user name"),
        "password_file": Key(str, "", "password file (`appliance passwd`), empty for none"),
        "acl_file": Key(str, "", "ACL file, empty to allow every topic"),
    },
    "limits": {
        "max_connections": Key(int, 10_000, "concurrent client connections", 1, 1_000_000),
        "max_packet_size": Key(int, 1_048_576, "largest packet accepted or sent, bytes", 64, 268_435_460),
        "receive_maximum": Key(int, 1024, "inbound QoS>0 messages a client may have unacknowledged", 1, 65535),
        "max_inflight": Key(int, 1024, "outbound unacknowledged QoS>0 messages per client", 1, 65535),
        "max_queued_messages": Key(int, 100_000, "messages held per session (waiting + inflight)", 1, 10_000_000),
        "queue_full_policy": Key(str, "drop-oldest", "when a queue is full", choices=QUEUE_POLICIES),
        "queue_qos0_offline": Key(bool, False, "queue QoS0 messages for offline persistent sessions"),
        "max_keepalive": Key(int, 0, "cap on client keep alive, seconds (0: none)", 0, 65535),
        "max_session_expiry": Key(int, NEVER_EXPIRES, "cap on session expiry, seconds", 0, U32),
        "v311_session_expiry": Key(int, NEVER_EXPIRES, "expiry of 3.1.1 clean_session=0 sessions", 0, U32),
        "retain_available": Key(bool, True, "accept retained messages"),
        "wildcard_subscriptions": Key(bool, True, "accept + and # in filters"),
        "shared_subscriptions": Key(bool, True, "accept $share/ filters"),
        "subscription_identifiers": Key(bool, True, "accept subscription identifiers"),
        "topic_alias_maximum": Key(int, 64, "topic aliases a client may use towards us", 0, 65535),
        "maximum_qos": Key(int, 2, "highest QoS accepted", 0, 2),
    },
    "store": {
        "batch_max": Key(int, 4096, "most operations in one group commit", 1, 1_000_000),
        "full_integrity_check": Key(bool, False, "run PRAGMA integrity_check (not quick_check) at start"),
    },
    "metrics": {
        "http": Key(str, "", "Prometheus /metrics and /status JSON HOST:PORT (e.g. 127.0.0.1:9883), empty: off"),
        "sys_interval": Key(int, 10, "seconds between $SYS updates (0: off)", 0, 86400),
    },
    "deliverylog": {
        "enabled": Key(bool, False, "write the delivery log"),
        "dir": Key(str, "", "segment directory (default: DATA_DIR/deliverylog)"),
        "segment_bytes": Key(int, 8_388_608, "rotate a segment at this size", 4096, 1 << 31),
        "segment_seconds": Key(int, 300, "rotate a segment at this age", 1, 86400),
        "budget_bytes": Key(int, 268_435_456, "disk budget for closed segments", 65536, 1 << 40),
        "seq_property": Key(str, "seq", "MQTT 5 user property carrying the publisher sequence number"),
        "format": Key(str, "parquet", "closed segment format (the open one is a gzip JSON Lines journal)",
                      choices=("parquet", "jsonl.gz")),
    },
    # Documented with what each policy trades in appliance/cluster/README.md; keep these names stable.
    "cluster": {
        "enabled": Key(bool, False, "join a LAN cluster of broker nodes"),
        "name": Key(str, "appliance", "cluster name; nodes of other clusters on the LAN are ignored"),
        "secret": Key(str, "", "shared secret authenticating peer links (or secret_file)"),
        "secret_file": Key(str, "", "file holding the shared secret (wins over secret)"),
        "bind": Key(str, "0.0.0.0:7946", "peer-link listener HOST:PORT"),
        "advertise": Key(str, "", "address announced to peers on mDNS (default: every interface address)"),
        "seeds": Key(list, [], "static peers HOST[:PORT] for networks without multicast"),
        "mdns": Key(bool, True, "discover peers and announce _mqtt._tcp with mDNS"),
        "mdns_ttl": Key(int, 120, "mDNS record TTL, seconds (a silent peer is dropped after it)", 2, 4500),
        "replication_factor": Key(int, 2, "copies of each persistent session's queue (owner + R-1 replicas)", 1, 5),
        "heartbeat_interval": Key(float, 1.0, "seconds between peer-link heartbeats", 0.05, 60),
        "failure_timeout": Key(float, 5.0, "seconds of silence before a peer is declared down", 0.2, 600),
        "anti_entropy_interval": Key(float, 10.0, "seconds between digest exchanges with every peer", 0.2, 3600),
        "allow_register": Key(bool, True, "accept CONNECT for a session whose owner node is unreachable"),
        "allow_publish": Key(bool, True, "acknowledge a publish whose subscriber node is unreachable"),
        "allow_subscribe": Key(bool, True, "accept SUBSCRIBE while a known node is unreachable"),
        "allow_unsubscribe": Key(bool, True, "accept UNSUBSCRIBE while a known node is unreachable"),
        "under_replicated": Key(str, "accept", "fewer than replication_factor nodes reachable",
                                choices=("accept", "refuse")),
        "tls_ca": Key(str, "", "cluster CA (PEM) for mutual TLS on peer links"),
        "tls_cert": Key(str, "", "this node's certificate (PEM) for peer links"),
        "tls_key": Key(str, "", "this node's key (PEM) for peer links"),
    },
}


def _node_host() -> str:
    return socket.gethostname() or "node"


@dataclass(slots=True)
class Config:
    """A validated configuration: raw sections plus the derived BrokerSettings."""

    values: dict[str, dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)  # sections owned by other components (cluster, upload)
    path: Path | None = None

    def get(self, section: str, key: str) -> Any:
        """The value of `section.key` (validated, defaulted)."""
        return self.values[section][key]

    @property
    def data_dir(self) -> Path:
        """The data directory as a path."""
        return Path(self.get("node", "data_dir"))

    @property
    def node_name(self) -> str:
        """The node name (the host name when not configured)."""
        return str(self.get("node", "name") or _node_host())

    def broker_settings(self) -> BrokerSettings:
        """The broker's policy settings from [limits] and [auth]."""
        lim = self.values["limits"]
        return BrokerSettings(
            node_id=self.node_name,
            allow_anonymous=self.get("auth", "allow_anonymous"),
            max_connections=lim["max_connections"],
            max_packet_size=lim["max_packet_size"],
            receive_maximum=lim["receive_maximum"],
            max_inflight=lim["max_inflight"],
            max_queued_messages=lim["max_queued_messages"],
            queue_full_policy=lim["queue_full_policy"],
            queue_qos0_offline=lim["queue_qos0_offline"],
            max_keepalive=lim["max_keepalive"],
            max_session_expiry=lim["max_session_expiry"],
            v311_persistent_session_expiry=lim["v311_session_expiry"],
            retain_available=lim["retain_available"],
            wildcard_subscriptions=lim["wildcard_subscriptions"],
            shared_subscriptions=lim["shared_subscriptions"],
            subscription_identifiers=lim["subscription_identifiers"],
            topic_alias_maximum=lim["topic_alias_maximum"],
            maximum_qos=lim["maximum_qos"],
            publisher_seq_property=self.get("deliverylog", "seq_property"),
        )


EXTERNAL_SECTIONS = ("upload",)


def _check(section: str, key: str, spec: Key, value: Any) -> Any:
    where = f"{section}.{key}"
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if spec.kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
            raise ConfigError(f"{where}: {value} is outside {spec.low}..{spec.high}")
        return float(value)
    if spec.kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return list(value)
    if spec.kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
            raise ConfigError(f"{where}: {value} is outside {spec.low}..{spec.high}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
    return value


def parse_hostport(text: str, where: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 as [addr]:port); raises ConfigError naming `where`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def load(path: Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """Read and validate a TOML file (or only defaults when `path` is None), then apply CLI overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{path}: {exc.strerror}") from None
    values: dict[str, dict[str, Any]] = {}
    extra: dict[str, Any] = {}
    for section, body in raw.items():
        if section in EXTERNAL_SECTIONS:
            extra[section] = body
        elif section not in SPEC:
            raise ConfigError(f"unknown section [{section}]")
        elif not isinstance(body, dict):
            raise ConfigError(f"{section}: expected a table")
    for section, keys in SPEC.items():
        body = dict(raw.get(section, {}))
        body.update((overrides or {}).get(section, {}))
        unknown = set(body) - set(keys)
        if unknown:
            raise ConfigError(f"{section}.{sorted(unknown)[0]}: unknown key")
        values[section] = {key: _check(section, key, spec, body.get(key, spec.default)) for key, spec in keys.items()}
    for key in ("tcp", "tls", "ws"):
        if values["listener"][key]:
            parse_hostport(values["listener"][key], f"listener.{key}")
    if values["metrics"]["http"]:
        parse_hostport(values["metrics"]["http"], "metrics.http")
    _check_cluster(values["cluster"])
    if isinstance(raw.get("cluster"), dict):
        extra["cluster"] = raw["cluster"]  # the raw table as written (provisioning checks read it back)
    listener = values["listener"]
    if (listener["tls"] or listener["ws_tls"]) and not (listener["certfile"] and listener["keyfile"]):
        raise ConfigError("listener.tls: needs listener.certfile and listener.keyfile")
    return Config(values, extra, path)


def _check_cluster(c: dict[str, Any]) -> None:
    """Cross-key rules of [cluster]."""
    parse_hostport(c["bind"], "cluster.bind")
    try:
        parse_seeds(c["seeds"], 7946)
    except ValueError as exc:
        raise ConfigError(f"cluster.seeds: {exc}") from None
    if not c["enabled"]:
        return
    if not c["name"]:
        raise ConfigError("cluster.name: must not be empty")
    if not (c["secret"] or c["secret_file"]):
        raise ConfigError("cluster.secret: a cluster needs secret or secret_file")
    tls = [c["tls_ca"], c["tls_cert"], c["tls_key"]]
    if any(tls) and not all(tls):
        raise ConfigError("cluster.tls_ca: tls_ca, tls_cert and tls_key go together")
    if c["heartbeat_interval"] >= c["failure_timeout"]:
        raise ConfigError("cluster.failure_timeout: must exceed cluster.heartbeat_interval")


def defaults_toml() -> str:
    """The documented default configuration, as TOML text."""
    lines = ["# appliance configuration: every key with its default"]
    for section, keys in SPEC.items():
        lines.append(f"\n[{section}]")
        for key, spec in keys.items():
            value = spec.default
            text = ("true" if value else "false") if isinstance(value, bool) else repr(value).replace("'", '"')
            lines.append(f"# {spec.doc}")
            lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"


__all__ = ["Config", "ConfigError", "defaults_toml", "load", "parse_hostport"]
