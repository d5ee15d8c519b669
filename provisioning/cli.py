"""`appliance-provision`: fleet inventory CSV -> per-device bundles + manifest, optionally written into an image."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import image
from .bundle import ClusterMaterial, FleetSettings, Issued, build_bundle, users_of
from .clusters import load_or_create_cluster
from .files import fsync_dir, write_file, write_private
from .inventory import Device, InventoryError, parse_inventory
from .pki import fingerprint

EXIT_REFUSED = 1  # existing bundles, image problems: nothing was changed
EXIT_USAGE = 2  # bad arguments or inventory
UPLOAD_KEY_ENV = ("APPLIANCE_UPLOAD_ACCESS_KEY_ID", "APPLIANCE_UPLOAD_SECRET_ACCESS_KEY")


class Refused(Exception):
    """An operation refused without changing anything; the message says why."""


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog="appliance-provision", description=__doc__)
    p.add_argument("--inventory", type=Path, help="fleet CSV: device_id,hostname,cluster,options")
    p.add_argument("--out", type=Path, required=True, help="output directory (bundles/, ca/, cloud/, manifest.json)")
    p.add_argument("--force", action="store_true", help="replace existing bundles (and a bundle already in the image)")
    p.add_argument("--fleet", default="default", help="fleet name written into every config")
    p.add_argument("--upload", help="default upload destination s3://BUCKET/PREFIX (none: upload off)")
    p.add_argument("--upload-endpoint", default="", help="S3-compatible endpoint URL (empty: the SDK default)")
    p.add_argument("--upload-region", default="", help="object-store region")
    p.add_argument("--cert-days", type=int, default=1825, help="node certificate validity in days")
    p.add_argument("--etc-dir", default="/etc/appliance", help="where the device keeps its config (paths in configs)")
    p.add_argument("--ssh-authorized-keys", type=Path, metavar="FILE",
                   help="OpenSSH public keys for root on devices with ssh=yes (sshd stays off on the others)")
    p.add_argument("--device", help="only this device id (required with --write-image when several are issued)")
    p.add_argument("--write-image", type=Path, metavar="IMG", help="also copy the bundle into IMG's FAT partition")
    p.add_argument("--partition", type=int, help="partition number of the FAT file system (default: the first FAT)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 refused, 2 bad input)."""
    args = parser().parse_args(argv)
    try:
        return _main(args)
    except InventoryError as exc:
        for line, message in exc.problems:
            print(f"appliance-provision: {args.inventory}:{line}: {message}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as exc:
        print(f"appliance-provision: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except image.ImageError as exc:
        print(f"appliance-provision: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ValueError as exc:
        print(f"appliance-provision: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _main(args: argparse.Namespace) -> int:
    if args.cert_days < 1:
        raise ValueError("--cert-days must be at least 1")
    if args.upload and not args.upload.startswith("s3://"):
        raise ValueError("--upload must be s3://BUCKET/PREFIX")
    out: Path = args.out
    if args.inventory is None:
        if not (args.write_image and args.device):
            raise ValueError("without --inventory, give --write-image IMG and --device ID to copy an existing bundle")
        bundle = out / "bundles" / args.device
        if not (bundle / "bundle.json").is_file():
            raise Refused(f"{bundle}: no bundle for device {args.device!r}")
        return _write_image(args, bundle)
    try:
        text = args.inventory.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{args.inventory}: cannot read: {exc}") from None
    devices = parse_inventory(text)
    missing_keys = [(d.line, "ssh=yes needs --ssh-authorized-keys") for d in devices if d.ssh]
    if missing_keys and args.ssh_authorized_keys is None:
        raise InventoryError(missing_keys)
    if args.device:
        devices = [d for d in devices if d.device_id == args.device]
        if not devices:
            raise ValueError(f"{args.inventory}: no device {args.device!r}")
    if args.write_image and len(devices) != 1:
        raise ValueError("--write-image takes one bundle: add --device ID")
    existing = [d.device_id for d in devices if (out / "bundles" / d.device_id).exists()]
    if existing and not args.force:
        raise Refused(f"{len(existing)} bundle(s) already exist in {out / 'bundles'} (first: {existing[0]}); "
                      "nothing written; use --force to replace them")
    issued = issue(out, devices, _fleet(args))
    print(f"appliance-provision: issued {len(issued)} bundle(s) in {out / 'bundles'}", file=sys.stderr)
    if args.write_image:
        return _write_image(args, out / "bundles" / devices[0].device_id)
    return 0


def _fleet(args: argparse.Namespace) -> FleetSettings:
    key_id, secret = (os.environ.get(name, "") for name in UPLOAD_KEY_ENV)
    if bool(key_id) != bool(secret):
        raise ValueError(f"set both {UPLOAD_KEY_ENV[0]} and {UPLOAD_KEY_ENV[1]}, or neither")
    return FleetSettings(fleet=args.fleet, etc_dir=args.etc_dir, cert_days=args.cert_days, upload=args.upload,
                         upload_endpoint=args.upload_endpoint, upload_region=args.upload_region,
                         shared_upload_key=(key_id, secret) if key_id else None,
                         ssh_authorized_keys=_ssh_keys(args.ssh_authorized_keys))


SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                 "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


def _ssh_keys(path: Path | None) -> bytes | None:
    """Read and check an authorized_keys file: every non-comment line is `TYPE BASE64 [comment]`."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    keys = 0
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) < 2 or words[0] not in SSH_KEY_TYPES or not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", words[1]):
            raise ValueError(f"{path}:{number}: not an OpenSSH public key line (options are not supported)")
        keys += 1
    if not keys:
        raise ValueError(f"{path}: no public keys")
    return text.encode() if text.endswith("\n") else text.encode() + b"\n"


def _write_image(args: argparse.Namespace, bundle: Path) -> int:
    written = image.write_bundle(args.write_image, bundle, partition=args.partition, force=args.force)
    print(f"appliance-provision: wrote {len(written)} files to {args.write_image}:/{image.DEST} (read back identical)",
          file=sys.stderr)
    return 0


def issue(out: Path, devices: list[Device], fleet: FleetSettings) -> list[Issued]:
    """Build every device's bundle in a staging directory, then move them into OUT/bundles and update the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    bundles = out / "bundles"
    bundles.mkdir(exist_ok=True, mode=0o700)
    clusters: dict[str, ClusterMaterial] = {}
    for name in dict.fromkeys(d.cluster for d in devices):
        members = [d for d in devices if d.cluster == name]
        users = list(dict.fromkeys(u for d in members for u in users_of(d)))
        (out / "ca").mkdir(exist_ok=True, mode=0o700)
        clusters[name], created = load_or_create_cluster(out / "ca" / name, name, users)
        for what in created:
            print(f"appliance-provision: created {what}", file=sys.stderr)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        issued = [build_bundle(staging / d.device_id, d, clusters[d.cluster], fleet) for d in devices]
        for d in devices:
            final = bundles / d.device_id
            if final.exists():
                final.rename(staging / f"replaced-{d.device_id}")
            (staging / d.device_id).rename(final)
        fsync_dir(bundles)
        _write_manifest(out, issued, clusters)
        _write_upload_keys(out, issued, fleet)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return issued


def _write_manifest(out: Path, issued: list[Issued], clusters: dict[str, ClusterMaterial]) -> None:
    path = out / "manifest.json"
    manifest: dict[str, Any] = (json.loads(path.read_text()) if path.exists()
                                else {"format": 1, "clusters": {}, "devices": {}})
    now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    for name, material in clusters.items():
        manifest["clusters"][name] = {
            "ca_serial": format(material.ca.cert.serial_number, "x"),
            "ca_fingerprint_sha256": fingerprint(material.ca.cert),
            "ca_not_after": material.ca.cert.not_valid_after_utc.isoformat(),
            "secret_id": hashlib.sha256(b"appliance-cluster-secret-id\0" + material.secret).hexdigest()[:16],
        }
    for item in issued:
        d = item.device
        manifest["devices"][d.device_id] = {
            "hostname": d.hostname, "cluster": d.cluster, "issued_at": now, "bundle": f"bundles/{d.device_id}",
            "certificate": item.cert, "mqtt_users": item.users,
            "upload_access_key_id": item.upload_key[0] if item.upload_key else None,
            "files": item.files,
        }
    manifest["updated_at"] = now
    tmp = out / "manifest.json.tmp"
    tmp.unlink(missing_ok=True)
    write_file(tmp, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    os.replace(tmp, path)


def _write_upload_keys(out: Path, issued: list[Issued], fleet: FleetSettings) -> None:
    """Per-device upload keys for the operator to register with the object store (OUT/cloud, 0600)."""
    fresh = {i.device.device_id: i.upload_key for i in issued if i.upload_key and fleet.shared_upload_key is None}
    if not fresh:
        return
    directory = out / "cloud"
    directory.mkdir(exist_ok=True, mode=0o700)
    path = directory / "upload-credentials.csv"
    rows: dict[str, list[str]] = {}
    if path.exists():
        for row in list(csv.reader(io.StringIO(path.read_text())))[1:]:
            rows[row[0]] = row
    for device_id, (key_id, secret) in fresh.items():
        rows[device_id] = [device_id, fleet.fleet, key_id, secret]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["device_id", "fleet", "access_key_id", "secret_access_key"])
    writer.writerows(rows[k] for k in sorted(rows))
    tmp = directory / "upload-credentials.csv.tmp"
    tmp.unlink(missing_ok=True)
    write_private(tmp, text.getvalue().encode())
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
