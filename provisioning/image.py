"""Write a bundle into a disk image's FAT boot partition with mtools (no mount, no loop device)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

# MBR partition types of FAT file systems, and the GPT type GUIDs a FAT boot partition uses (ESP, basic data).
FAT_MBR_TYPES = {"1", "4", "6", "b", "c", "e", "ef"}
FAT_GPT_TYPES = {"C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7"}
DEST = "appliance"  # /boot/firmware/appliance on the device


class ImageError(RuntimeError):
    """The image cannot take the bundle (no FAT partition, bundle already there, mtools failure, bad read-back)."""


def _run(args: list[str], *, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLS_NO_VFAT="0")
    try:
        proc = subprocess.run(args, input=stdin, capture_output=True, env=env, timeout=300, check=False)
    except FileNotFoundError:
        raise ImageError(f"{args[0]} not found: install mtools and fdisk") from None
    if check and proc.returncode != 0:
        raise ImageError(f"{' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc


def fat_partition_offset(image: Path, partition: int | None = None) -> int:
    """Byte offset of the FAT partition (the first one, or number `partition`, 1-based) in `image`."""
    if not image.is_file():
        raise ImageError(f"{image}: no such image file")
    proc = _run(["sfdisk", "--json", str(image)], check=False)
    if proc.returncode != 0:
        raise ImageError(f"{image}: no partition table: {proc.stderr.decode(errors='replace').strip()}")
    table = json.loads(proc.stdout)["partitiontable"]
    sector = int(table.get("sectorsize", 512))
    parts = table.get("partitions", [])
    if partition is not None:
        if not 1 <= partition <= len(parts):
            raise ImageError(f"{image}: has {len(parts)} partitions, not {partition}")
        return int(parts[partition - 1]["start"]) * sector
    for part in parts:
        kind = str(part.get("type", "")).lower()
        if kind in FAT_MBR_TYPES or kind.upper() in FAT_GPT_TYPES:
            return int(part["start"]) * sector
    raise ImageError(f"{image}: no FAT partition (types: {', '.join(str(p.get('type')) for p in parts) or 'none'})")


def _at(image: Path, offset: int) -> str:
    return f"{image}@@{offset}"


def exists(image: Path, offset: int, path: str) -> bool:
    """True when `path` (e.g. 'appliance') exists on the FAT file system."""
    return _run(["mdir", "-b", "-i", _at(image, offset), f"::/{path}"], check=False).returncode == 0


def read_file(image: Path, offset: int, path: str) -> bytes:
    """The content of `path` on the FAT file system."""
    return _run(["mcopy", "-n", "-i", _at(image, offset), f"::/{path}", "-"]).stdout


def write_bundle(image: Path, bundle: Path, *, partition: int | None = None, force: bool = False) -> list[str]:
    """Copy `bundle` to ::/appliance on the image's FAT partition, read every file back, return their paths.

    The bundle is written under a temporary name and renamed last, so a half-written copy is never taken for a bundle.
    """
    offset = fat_partition_offset(image, partition)
    at = _at(image, offset)
    _run(["minfo", "-i", at, "::"])  # a FAT file system is there
    if exists(image, offset, DEST):
        if not force:
            raise ImageError(f"{image}: already holds a bundle in /{DEST}; use --force to replace it")
        _run(["mdeltree", "-i", at, f"::/{DEST}"])
    staging = f"{DEST}.new"
    if exists(image, offset, staging):
        _run(["mdeltree", "-i", at, f"::/{staging}"])
    files = sorted(p for p in bundle.rglob("*") if p.is_file())
    dirs = sorted({p.parent.relative_to(bundle) for p in files} - {Path(".")}, key=lambda p: len(p.parts))
    _run(["mmd", "-i", at, f"::/{staging}", *(f"::/{staging}/{d.as_posix()}" for d in dirs)])
    written = []
    for path in files:
        rel = path.relative_to(bundle).as_posix()
        _run(["mcopy", "-n", "-o", "-i", at, str(path), f"::/{staging}/{rel}"])
        written.append(rel)
    for rel in written:
        if hashlib.sha256(read_file(image, offset, f"{staging}/{rel}")).digest() != \
                hashlib.sha256((bundle / rel).read_bytes()).digest():
            raise ImageError(f"{image}: /{staging}/{rel} reads back different from {bundle / rel}")
    _run(["mren", "-i", at, f"::/{staging}", f"::/{DEST}"])
    return written
