"""One device's provisioning bundle: config, ACL, certificates and 0600 secrets, indexed by bundle.json."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from appliance.broker.acl import Acl
from appliance.broker.passwords import format_password_file, hash_password
from appliance.server.config import ConfigError, load

from .files import sha256_file, write_file, write_private
from .inventory import Device
from .pki import ClusterCA, fingerprint, issue_node_cert

BUNDLE_FORMAT = 1
INDEX = "bundle.json"
SECRETS = "secrets"  # every file below this directory is a secret: 0600 in the bundle and on the device
SSH = "ssh"  # ssh/authorized_keys: first boot installs it for root and enables sshd
ADMIN = "admin"
DATA_DIR = "/var/lib/appliance"  # systemd StateDirectory=appliance
LOGS_DIR = "/var/log/appliance"  # systemd LogsDirectory=appliance
PORTS = {"tcp": 1883, "tls": 8883, "ws": 8080}
UPLOAD_CREDENTIALS = "aws-credentials"  # under secrets/


@dataclass(slots=True)
class ClusterMaterial:
    """What every device of one cluster shares: CA, link secret, MQTT users (passwords and their hashes)."""

    name: str
    ca: ClusterCA
    secret: bytes
    passwords: dict[str, str]  # user -> plaintext, kept for the operator in DIR/ca/<cluster>/mqtt-users.txt
    hashes: dict[str, str] = field(default_factory=dict)  # user -> scrypt hash, computed once per run

    def hash_for(self, user: str) -> str:
        """The scrypt hash of `user`'s password (one salt per cluster and run; the password is the same anyway)."""
        if user not in self.hashes:
            self.hashes[user] = hash_password(self.passwords[user])
        return self.hashes[user]


@dataclass(slots=True)
class FleetSettings:
    """Fleet-wide provisioning settings from the command line."""

    fleet: str = "default"
    etc_dir: str = "/etc/appliance"
    cert_days: int = 1825
    upload: str | None = None  # s3://bucket/prefix, None for no upload
    upload_endpoint: str = ""
    upload_region: str = ""
    shared_upload_key: tuple[str, str] | None = None  # (access key id, secret) for every device, else one per device
    ssh_authorized_keys: bytes | None = None  # for devices with ssh=yes


@dataclass(slots=True)
class Issued:
    """What building one bundle issued, for the manifest (never secret material itself)."""

    device: Device
    files: dict[str, dict[str, str]]
    cert: dict[str, str] | None
    upload_key: tuple[str, str] | None  # (access key id, secret): the secret goes only to the operator's import file
    users: list[str]


def new_password() -> str:
    """A random 24-character password (about 143 bits)."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(24))


def new_upload_key() -> tuple[str, str]:
    """A random (access key id, secret access key) pair in the usual S3 shapes."""
    key_id = "AK" + "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(18))
    return key_id, secrets.token_urlsafe(30)


def users_of(device: Device) -> dict[str, list[tuple[str, str]]]:
    """User -> [(access, filter)] for a device: the built-in admin plus the inventory's grants, in order."""
    users: dict[str, list[tuple[str, str]]] = {ADMIN: [("readwrite", "#")]}
    for grant in device.grants:
        users.setdefault(grant.name, []).append((grant.access, grant.topic_filter))
    return users


def render_acl(device: Device, users: dict[str, list[tuple[str, str]]]) -> str:
    """The ACL file (`user NAME` sections of `topic ACCESS FILTER` lines), checked by the broker's own parser."""
    lines = [f"# ACL for {device.hostname} (cluster {device.cluster}), written by appliance-provision"]
    for user, rules in users.items():
        lines.append(f"\nuser {user}")
        lines.extend(f"topic {access} {topic_filter}" for access, topic_filter in rules)
    text = "\n".join(lines) + "\n"
    Acl.parse(text)
    return text


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def render_toml(sections: dict[str, dict[str, Any]], header: str) -> str:
    """Render nested dicts as TOML tables."""
    out = [f"# {header}"]
    for section, body in sections.items():
        out.append(f"\n[{section}]")
        out.extend(f"{key} = {_toml(value)}" for key, value in body.items())
    return "\n".join(out) + "\n"


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _split_s3(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def device_config(device: Device, fleet: FleetSettings, upload: str | None) -> dict[str, dict[str, Any]]:
    """The appliance.toml sections for a device, with paths as they will be on the device."""
    etc = PurePosixPath(fleet.etc_dir)
    listener: dict[str, Any] = {"tcp": _hostport(device.listen, PORTS["tcp"])}
    if device.tls:
        listener |= {"tls": _hostport(device.listen, PORTS["tls"]), "certfile": str(etc / "node.crt"),
                     "keyfile": str(etc / SECRETS / "node.key"), "cafile": str(etc / "cluster-ca.crt")}
    if device.ws:
        listener["ws"] = _hostport(device.listen, PORTS["ws"])
    config: dict[str, dict[str, Any]] = {
        "node": {"name": device.hostname, "data_dir": DATA_DIR, "fleet": fleet.fleet, "device": device.device_id},
        "listener": listener,
        "auth": {"allow_anonymous": device.anonymous, "password_file": str(etc / SECRETS / "passwd"),
                 "acl_file": str(etc / "acl")},
        "deliverylog": {"enabled": upload is not None, "dir": f"{LOGS_DIR}/deliverylog"},
        # Named as appliance.cluster.service.ClusterConfig names them; peer links use mutual TLS when the cluster has
        # certificates (the inventory guarantees all nodes of a cluster agree), always the HMAC secret.
        "cluster": {"name": device.cluster, "mdns": True, "secret_file": str(etc / SECRETS / "cluster.secret")},
    }
    if device.tls:
        config["cluster"] |= {"tls_ca": str(etc / "cluster-ca.crt"), "tls_cert": str(etc / "node.crt"),
                              "tls_key": str(etc / SECRETS / "node.key")}
    if upload is not None:
        bucket, prefix = _split_s3(upload)
        config["upload"] = {"bucket": bucket, "prefix": prefix}
        if fleet.upload_endpoint:
            config["upload"]["endpoint"] = fleet.upload_endpoint
        if fleet.upload_region:
            config["upload"]["region"] = fleet.upload_region
    return config


def build_bundle(target: Path, device: Device, cluster: ClusterMaterial, fleet: FleetSettings) -> Issued:
    """Write `device`'s bundle into the new directory `target` and return what was issued."""
    target.mkdir(mode=0o700)
    (target / SECRETS).mkdir(mode=0o700)
    upload = fleet.upload if device.upload is None else (None if device.upload == "off" else device.upload)
    config = device_config(device, fleet, upload)
    files: dict[str, bytes] = {}
    secret_files: dict[str, bytes] = {}
    files["appliance.toml"] = render_toml(config, f"{device.device_id}: written by appliance-provision").encode()
    users = users_of(device)
    files["acl"] = render_acl(device, users).encode()
    files["cluster-ca.crt"] = cluster.ca.cert_pem
    secret_files["cluster.secret"] = cluster.secret.hex().encode() + b"\n"
    secret_files["passwd"] = format_password_file({u: cluster.hash_for(u) for u in users}).encode()
    cert_info: dict[str, str] | None = None
    if device.tls:
        node = issue_node_cert(cluster.ca, device.hostname, device.device_id, fleet.cert_days,
                               [device.listen])
        files["node.crt"] = node.cert_pem
        secret_files["node.key"] = node.key_pem
        cert_info = {"serial": format(node.cert.serial_number, "x"), "fingerprint_sha256": fingerprint(node.cert),
                     "not_after": node.cert.not_valid_after_utc.isoformat(),
                     "subject": node.cert.subject.rfc4514_string()}
    upload_key: tuple[str, str] | None = None
    if upload is not None:
        upload_key = fleet.shared_upload_key or new_upload_key()
        # The AWS shared-credentials format: appliance-upload.service points AWS_SHARED_CREDENTIALS_FILE here, so the
        # secret stays out of appliance.toml.
        secret_files[UPLOAD_CREDENTIALS] = (f"# {device.device_id}: object-store key for appliance upload\n[default]\n"
                                            f"aws_access_key_id = {upload_key[0]}\n"
                                            f"aws_secret_access_key = {upload_key[1]}\n").encode()
    if device.ssh:
        if fleet.ssh_authorized_keys is None:
            raise ValueError(f"{device.device_id}: ssh=yes needs --ssh-authorized-keys")
        (target / SSH).mkdir(mode=0o700)
        files[f"{SSH}/authorized_keys"] = fleet.ssh_authorized_keys
    for name, data in files.items():
        write_file(target / name, data, 0o644)
    for name, data in secret_files.items():
        write_private(target / SECRETS / name, data)
    try:
        load(target / "appliance.toml")  # the broker's own loader must accept what we issue
    except ConfigError as exc:
        raise ValueError(f"generated config for {device.device_id} rejected by the broker: {exc}") from None
    listing = {name: {"sha256": sha256_file(target / name), "mode": "0644"} for name in files}
    listing |= {f"{SECRETS}/{name}": {"sha256": sha256_file(target / SECRETS / name), "mode": "0600"}
                for name in secret_files}
    index: dict[str, Any] = {"format": BUNDLE_FORMAT, "device_id": device.device_id, "hostname": device.hostname,
             "cluster": device.cluster, "files": dict(sorted(listing.items()))}
    write_file(target / INDEX, (json.dumps(index, indent=2) + "\n").encode(), 0o644)
    return Issued(device, index["files"], cert_info, upload_key, list(users))
