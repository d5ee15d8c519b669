"""First boot: verify the bundle on the boot partition, install it under /etc/appliance, wipe it off the FAT partition.

Standard library only: it runs from appliance-firstboot.service before the broker, with no network.
"""

from __future__ import annotations

import argparse
import datetime as dt
import grp
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from provisioning.files import fsync_dir

INDEX = "bundle.json"
SECRETS = "secrets"
SSH_KEYS = "ssh/authorized_keys"  # not installed under etc: root's authorized_keys, and sshd gets enabled
RECORD = "provisioned.json"  # what was applied, kept in the etc dir (hashes only)


class BundleError(Exception):
    """A bundle that is incomplete, altered or unsafe; nothing has been installed."""


def load_index(bundle: Path) -> dict:
    """Read bundle.json and check every listed file's SHA-256 and path; raise BundleError on any mismatch."""
    try:
        index = json.loads((bundle / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{bundle / INDEX}: unreadable: {exc}") from None
    if index.get("format") != 1 or not isinstance(index.get("files"), dict) or not index["files"]:
        raise BundleError(f"{bundle / INDEX}: not a format-1 bundle index")
    for rel, meta in index["files"].items():
        parts = PurePosixPath(rel).parts
        if PurePosixPath(rel).is_absolute() or ".." in parts or rel == INDEX or len(parts) > 2:
            raise BundleError(f"{bundle / INDEX}: unsafe path {rel!r}")
        try:
            data = (bundle / rel).read_bytes()
        except OSError as exc:
            raise BundleError(f"{bundle / rel}: missing or unreadable: {exc.strerror}") from None
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise BundleError(f"{bundle / rel}: content differs from {INDEX} (corrupted or altered copy)")
    return index


def _install(data: bytes, target: Path, mode: int, uid: int, gid: int) -> None:
    tmp = target.with_name(f".{target.name}.new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)


def _ensure_dir(path: Path, mode: int, uid: int, gid: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def enable_ssh(keys: bytes, home: Path, unit: str) -> None:
    """Install root's authorized_keys (0600) and enable + start `unit` (empty: keys only, e.g. in a chroot)."""
    _ensure_dir(home / ".ssh", 0o700, 0, 0)
    _install(keys, home / ".ssh" / "authorized_keys", 0o600, 0, 0)
    if unit:
        # --no-block: this runs inside the boot transaction; sshd starts once its own ordering allows.
        # SYSTEMCTL_SKIP_SYSV: Debian's systemctl would also run update-rc.d on /etc/rc?.d, outside our sandbox.
        proc = subprocess.run(["systemctl", "enable", "--now", "--no-block", unit], capture_output=True, text=True,
                              env={**os.environ, "SYSTEMCTL_SKIP_SYSV": "1"}, check=False)
        if proc.returncode != 0:
            raise BundleError(f"systemctl enable --now {unit}: {proc.stderr.strip()}")


def apply(bundle: Path, etc: Path, user: str, ssh_home: Path = Path("/root"), ssh_unit: str = "ssh.service") -> dict:
    """Install a verified bundle into `etc` (secrets 0600 owned by `user`), then wipe and remove the bundle."""
    index = load_index(bundle)
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise BundleError(f"no user {user!r} (systemd-sysusers should have created it)") from None
    uid, gid = account.pw_uid, account.pw_gid
    try:
        root_gid = grp.getgrnam("root").gr_gid
    except KeyError:
        root_gid = 0
    _ensure_dir(etc, 0o750, 0, gid)
    _ensure_dir(etc / SECRETS, 0o700, uid, gid)
    for rel in index["files"]:
        data = (bundle / rel).read_bytes()
        if rel == SSH_KEYS:
            continue  # after the appliance's own files, below
        if PurePosixPath(rel).parts[0] == SECRETS:
            _install(data, etc / rel, 0o600, uid, gid)  # secrets: the broker's user only
        elif rel.endswith(".crt"):
            _install(data, etc / rel, 0o644, 0, root_gid)  # public certificates
        else:
            _install(data, etc / rel, 0o640, 0, gid)  # config and ACL: root writes, the broker reads
    if SSH_KEYS in index["files"]:
        enable_ssh((bundle / SSH_KEYS).read_bytes(), ssh_home, ssh_unit)  # a failure leaves the bundle for a retry
    record = {"applied_at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
              "device_id": index.get("device_id"), "hostname": index.get("hostname"), "cluster": index.get("cluster"),
              "ssh": SSH_KEYS in index["files"],
              "files": {rel: meta["sha256"] for rel, meta in index["files"].items()}}
    _install((json.dumps(record, indent=2) + "\n").encode(), etc / RECORD, 0o644, 0, root_gid)
    fsync_dir(etc / SECRETS)
    fsync_dir(etc)
    os.sync()  # the installed copy is durable before the only other copy is destroyed
    wipe(bundle, index)
    return record


def wipe(bundle: Path, index: dict) -> None:
    """Overwrite each bundle file with zeros, then delete the files and the bundle directory."""
    for rel in [*index["files"], INDEX]:
        path = bundle / rel
        try:
            size = path.stat().st_size
            with path.open("r+b", buffering=0) as handle:
                handle.write(b"\0" * size)  # FAT rewrites clusters in place; flash wear-levelling may still keep a copy
                os.fsync(handle.fileno())
        except OSError:
            pass
    shutil.rmtree(bundle)
    fsync_dir(bundle.parent)
    os.sync()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of appliance-firstboot.service; 0 applied, 1 bad bundle (left in place for the operator)."""
    p = argparse.ArgumentParser(prog="appliance-firstboot", description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("/boot/firmware/appliance"))
    p.add_argument("--etc", type=Path, default=Path("/etc/appliance"))
    p.add_argument("--user", default="appliance")
    p.add_argument("--ssh-home", type=Path, default=Path("/root"), help="whose authorized_keys a bundle may set")
    p.add_argument("--ssh-unit", default="ssh.service", help="unit to enable when it does ('' for none)")
    args = p.parse_args(argv)
    if not args.bundle.is_dir():
        print(f"appliance-firstboot: no bundle at {args.bundle}: nothing to do", file=sys.stderr)
        return 0
    try:
        record = apply(args.bundle, args.etc, args.user, args.ssh_home, args.ssh_unit)
    except BundleError as exc:
        print(f"appliance-firstboot: {exc}; bundle left in place, nothing installed", file=sys.stderr)
        return 1
    print(f"appliance-firstboot: applied bundle of {record['device_id']} ({len(record['files'])} files) to "
          f"{args.etc}; removed it from {args.bundle}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
