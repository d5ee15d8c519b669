#!/usr/bin/env python3
"""Install or remove a pure-Python wheel in the image's venv from the host: no pip and no arm64 emulation."""

from __future__ import annotations

import argparse
import base64
import configparser
import csv
import hashlib
import importlib.util
import io
import marshal
import os
import py_compile
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

# The console-script wrapper pip writes, so that an entry point behaves the same whichever tool installed it.
SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {attr}
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit({call}())
"""


class WheelError(Exception):
    """The wheel or the target venv is not what this installer handles."""


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def venv_paths(root: Path, prefix: str) -> tuple[Path, Path]:
    """(site-packages, bin) of the venv at PREFIX inside ROOT."""
    venv = root / prefix.lstrip("/")
    found = sorted((venv / "lib").glob("python3.*/site-packages"))
    if len(found) != 1:
        raise WheelError(f"expected one site-packages under {venv}/lib, found {[str(p) for p in found]}")
    return found[0], venv / "bin"


def record_hash(data: bytes) -> str:
    """RECORD's sha256=<urlsafe base64, unpadded>."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write a root-owned file with an exact mode (no umask), making root-owned 0755 parents."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    for parent in missing:
        parent.mkdir()
        os.chmod(parent, 0o755)
        os.chown(parent, 0, 0)
    path.write_bytes(data)
    os.chmod(path, mode)
    os.chown(path, 0, 0)


def inside(path: Path, *bases: Path) -> bool:
    """True if the normalised path lies under one of the bases (no '..' escapes from a hostile wheel)."""
    norm = os.path.normpath(path)
    return any(norm.startswith(os.path.normpath(b) + os.sep) for b in bases)


def install(root: Path, prefix: str, wheel: Path, compile_pyc: bool,
            extra: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Unpack WHEEL into the venv, write its scripts and RECORD, byte-compile with this interpreter; .py files.

    `extra`: (file, path under site-packages) pairs installed with the wheel and in its RECORD (the cross-built
    extension modules of an otherwise pure wheel).
    """
    site, bindir = venv_paths(root, prefix)
    python = f"{prefix.rstrip('/')}/bin/python3"
    installed: list[Path] = []
    sources: list[Path] = []
    with zipfile.ZipFile(wheel) as zf:
        names = sorted(n for n in zf.namelist() if not n.endswith("/"))
        infos = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        if len(infos) != 1:
            raise WheelError(f"{wheel.name}: expected one .dist-info directory, found {sorted(infos)}")
        dist_info = infos.pop()
        data_dir = dist_info.removesuffix(".dist-info") + ".data"
        if "Root-Is-Purelib: true" not in zf.read(f"{dist_info}/WHEEL").decode():
            raise WheelError(f"{wheel.name} is not a pure-Python wheel")
        for _, rel in extra or []:  # checked before anything is written
            parent = rel.rpartition("/")[0]
            if (not parent or ".." in rel.split("/") or rel in names
                    or not any(n.startswith(parent + "/") for n in names)):
                raise WheelError(f"--add {rel}: not a new file in a package directory of {wheel.name}")
        if any((site / n.split("/")[0]).exists() for n in names if "/" in n and not n.startswith(data_dir)):
            raise WheelError(f"{wheel.name}: a package of it is already installed (remove it first)")
        for name in names:
            if name == f"{dist_info}/RECORD":
                continue
            data = zf.read(name)
            executable = (zf.getinfo(name).external_attr >> 16) & 0o111
            if name.startswith(data_dir + "/"):
                kind, _, rest = name[len(data_dir) + 1:].partition("/")
                if kind in ("purelib", "platlib"):
                    dest = site / rest
                elif kind == "scripts":
                    dest, executable = bindir / rest, 0o111
                    if data.startswith(b"#!python"):
                        data = b"#!" + python.encode() + data[len(b"#!python"):]
                else:
                    raise WheelError(f"{wheel.name}: .data/{kind} is not supported")
            else:
                dest = site / name
            if not inside(dest, site, bindir):
                raise WheelError(f"{wheel.name}: {name} would land outside the venv")
            write_file(dest, data, 0o755 if executable else 0o644)
            installed.append(dest)
            if dest.suffix == ".py" and inside(dest, site):
                sources.append(dest)
        for src, rel in extra or []:
            dest = site / rel
            write_file(dest, src.read_bytes(), 0o644)
            installed.append(dest)
        entry_points = configparser.ConfigParser(delimiters=("=",))
        entry_points.optionxform = str  # type: ignore[assignment,method-assign]
        if f"{dist_info}/entry_points.txt" in names:
            entry_points.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
    if entry_points.has_section("console_scripts"):
        for script, target in sorted(entry_points.items("console_scripts")):
            module, _, attr = target.strip().partition(":")
            dest = bindir / script
            text = SCRIPT.format(python=python, module=module, attr=attr.split(".")[0], call=attr.strip())
            write_file(dest, text.encode(), 0o755)
            installed.append(dest)
    info = site / dist_info
    for name, data in (("INSTALLER", b"appliance-image\n"), ("REQUESTED", b"")):
        write_file(info / name, data, 0o644)
        installed.append(info / name)
    pycs = [Path(importlib.util.cache_from_source(str(src))) for src in sources]
    if compile_pyc:
        for src, pyc in zip(sources, pycs, strict=True):
            compile_one(src, pyc, root)
    # RECORD: every file with hash and size, the byte-code files and RECORD itself without (as pip does).
    rows = [(os.path.relpath(p, site), record_hash(p.read_bytes()), str(p.stat().st_size)) for p in installed]
    rows += [(os.path.relpath(p, site), "", "") for p in pycs]
    rows.append((f"{dist_info}/RECORD", "", ""))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(sorted(rows))
    write_file(info / "RECORD", buf.getvalue().encode(), 0o644)
    return sources


def compile_one(src: Path, pyc: Path, root: Path) -> None:
    """Byte-compile SRC as the device will see it (its path inside the image), checked-hash: no mtime in the .pyc."""
    device_path = "/" + os.path.relpath(src, root)
    if not pyc.parent.is_dir():
        pyc.parent.mkdir()
    tmp = pyc.with_suffix(".tmp")
    py_compile.compile(str(src), cfile=str(tmp), dfile=device_path, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    os.chmod(tmp, 0o644)
    os.chown(tmp, 0, 0)
    os.chown(pyc.parent, 0, 0)
    os.chmod(pyc.parent, 0o755)
    tmp.rename(pyc)


def distribution(site: Path, name: str) -> Path:
    """The one installed .dist-info of project NAME."""
    found = [d for d in site.glob("*.dist-info") if canonical(d.name.split("-")[0]) == canonical(name)]
    if len(found) != 1:
        raise WheelError(f"expected one installed {name} in {site}, found {[d.name for d in found]}")
    return found[0]


def remove(root: Path, prefix: str, name: str) -> int:
    """Delete every file the distribution's RECORD lists (and the directories that leaves empty); file count."""
    site, bindir = venv_paths(root, prefix)
    info = distribution(site, name)
    with (info / "RECORD").open(newline="") as f:
        paths = [Path(os.path.normpath(site / row[0])) for row in csv.reader(f) if row]
    parents = set()
    for path in paths:
        if not inside(path, site, bindir):
            raise WheelError(f"RECORD of {info.name} names {path}, outside the venv")
        if path.suffix == ".py":
            cached = Path(importlib.util.cache_from_source(str(path)))
            cached.unlink(missing_ok=True)
            parents.add(cached.parent)
        path.unlink(missing_ok=True)
        parents.add(path.parent)
    shutil.rmtree(info, ignore_errors=True)
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while parent not in (site, bindir) and inside(parent, site, bindir) and parent.is_dir() \
                and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return len(paths)


def same_code(image_pyc: bytes, host_pyc: bytes) -> bool:
    """Same header (magic, checked-hash flags, source hash) and equal code objects; marshal's reference flags may
    differ with the compiling process's string interning, which changes bytes but not the code."""
    return image_pyc[:16] == host_pyc[:16] and marshal.loads(image_pyc[16:]) == marshal.loads(host_pyc[16:])


def same_bytecode(root: Path, prefix: str, name: str) -> tuple[int, list[str]]:
    """Compile the distribution's sources with this interpreter; (files compared, those whose .pyc differs)."""
    site, _ = venv_paths(root, prefix)
    info = distribution(site, name)
    with (info / "RECORD").open(newline="") as f:
        sources = [site / row[0] for row in csv.reader(f) if row and row[0].endswith(".py")]
    differ = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, src in enumerate(sources):
            out = Path(tmp) / f"{i}.pyc"
            py_compile.compile(str(src), cfile=str(out), dfile="/" + os.path.relpath(src, root), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            image_pyc = Path(importlib.util.cache_from_source(str(src)))
            if not image_pyc.exists() or not same_code(image_pyc.read_bytes(), out.read_bytes()):
                differ.append(os.path.relpath(src, site))
    return len(sources), differ


def main(argv: list[str]) -> int:
    """install_wheel.py {install,remove,same-bytecode} --root DIR --prefix /opt/appliance ..."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("action", choices=("install", "remove", "same-bytecode"))
    p.add_argument("--root", type=Path, required=True, help="the image's root tree")
    p.add_argument("--prefix", required=True, help="the venv's path on the device")
    p.add_argument("--wheel", type=Path, help="install: the wheel")
    p.add_argument("--name", help="remove / same-bytecode: the project name")
    p.add_argument("--no-compile", action="store_true", help="install: leave byte-compiling to the image's python")
    p.add_argument("--add", nargs=2, action="append", default=[], metavar=("FILE", "PATH"),
                   help="install: also FILE at PATH under site-packages, in the wheel's RECORD")
    args = p.parse_args(argv)
    try:
        if args.action == "install":
            if args.wheel is None:
                p.error("install needs --wheel")
            extra = [(Path(src), rel) for src, rel in args.add]
            for src in install(args.root, args.prefix, args.wheel, not args.no_compile, extra):
                print(src.relative_to(args.root))
        elif args.action == "remove":
            print(f"removed {remove(args.root, args.prefix, args.name)} files of {args.name}", file=sys.stderr)
        else:
            count, differ = same_bytecode(args.root, args.prefix, args.name)
            print(f"{count} sources, {len(differ)} with different byte code {differ[:5]}", file=sys.stderr)
            return 0 if count and not differ else 1
    except WheelError as exc:
        print(f"install_wheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
