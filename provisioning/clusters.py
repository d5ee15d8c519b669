"""Per-cluster material kept by the operator in DIR/ca/<cluster>/ and reused by every run (all files 0600)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from appliance.broker.passwords import PasswordFormatError, check_username

from .bundle import ClusterMaterial, new_password
from .files import write_private
from .pki import load_or_create_ca

SECRET_BYTES = 32
SECRET_FILE = "cluster.secret"  # 64 hex characters: the HMAC key of cluster links, the same on every node
USERS_FILE = "mqtt-users.txt"  # user:password, plaintext, for configuring MQTT clients; never leaves DIR/ca


def load_or_create_cluster(directory: Path, name: str, users: list[str]) -> tuple[ClusterMaterial, list[str]]:
    """Load (or create) the cluster's CA, secret and user passwords, adding passwords for new users.

    Returns the material and a list of what was newly created, for the operator's summary.
    """
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    created: list[str] = []
    ca, new_ca = load_or_create_ca(directory, name)
    if new_ca:
        created.append(f"CA for cluster {name}")
    secret_path = directory / SECRET_FILE
    if secret_path.exists():
        try:
            secret = bytes.fromhex(secret_path.read_text().strip())
        except ValueError:
            raise ValueError(f"{secret_path}: expected {SECRET_BYTES * 2} hex characters") from None
        if len(secret) != SECRET_BYTES:
            raise ValueError(f"{secret_path}: expected {SECRET_BYTES * 2} hex characters")
    else:
        secret = secrets.token_bytes(SECRET_BYTES)
        write_private(secret_path, secret.hex().encode() + b"\n")
        created.append(f"secret for cluster {name}")
    users_path = directory / USERS_FILE
    passwords = _read_passwords(users_path) if users_path.exists() else {}
    missing = [user for user in users if user not in passwords]
    if missing:
        passwords |= {user: new_password() for user in missing}
        text = "".join(f"{user}:{password}\n" for user, password in sorted(passwords.items()))
        tmp = users_path.with_name(USERS_FILE + ".tmp")
        tmp.unlink(missing_ok=True)
        write_private(tmp, text.encode())
        os.replace(tmp, users_path)
        created.append(f"passwords for {', '.join(missing)} in cluster {name}")
    return ClusterMaterial(name, ca, secret, passwords), created


def _read_passwords(path: Path) -> dict[str, str]:
    passwords: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        user, sep, password = line.partition(":")
        try:
            check_username(user)
        except PasswordFormatError as exc:
            raise ValueError(f"{path}: line {number}: {exc}") from None
        if not sep or not password:
            raise ValueError(f"{path}: line {number}: expected user:password")
        passwords[user] = password
    return passwords
