"""The image build's host-side tools on small inputs: cached xz blocks, the ext4 delta, the host wheel installer."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import lzma
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.image.conftest import REPO, run

IMAGE = REPO / "image"
MIB = 1024 * 1024


def tool(name: str, *args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run image/NAME.py with this interpreter."""
    return run([sys.executable, str(IMAGE / f"{name}.py"), *map(str, args)], check=check)


def test_xz_blocks_decompress_to_the_image_and_only_changed_blocks_are_recompressed(tmp_path: Path) -> None:
    data = bytearray(os.urandom(MIB) + bytes(3 * MIB) + os.urandom(MIB // 2))
    image, xz, cache = tmp_path / "disk.img", tmp_path / "disk.img.xz", tmp_path / "cache"
    image.write_bytes(data)
    first = tool("xzchunks", image, xz, "--cache", cache, "--level", "0", "--chunk-mib", "1",
                 "--image-sha256", tmp_path / "disk.img.sha256")
    assert "2 cached, 3 compressed" in first.stderr  # 5 chunks, three of them zeros: 3 distinct blocks
    assert lzma.decompress(xz.read_bytes()) == data
    assert (tmp_path / "disk.img.sha256").read_text() == f"{hashlib.sha256(data).hexdigest()}  disk.img\n"
    run(["xz", "-t", str(xz)])
    listing = run(["xz", "--robot", "-l", str(xz)]).stdout
    totals = next(line.split("\t") for line in listing.splitlines() if line.startswith("totals"))
    assert (totals[1], totals[2]) == ("1", "5"), "one stream of five blocks"
    data[2 * MIB + 7] = 1  # one byte in the third chunk
    image.write_bytes(data)
    second = tool("xzchunks", image, xz, "--cache", cache, "--level", "0", "--chunk-mib", "1")
    assert "4 cached, 1 compressed" in second.stderr
    assert lzma.decompress(xz.read_bytes()) == data


def make_tree(root: Path) -> None:
    """A small root tree with a directory, files of several sizes and a symlink."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("device\n")
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "usr" / "lib" / "big.bin").write_bytes(os.urandom(300_000))
    (root / "usr" / "bin").mkdir()
    os.symlink("../lib/big.bin", root / "usr" / "bin" / "big")


def tree_list(root: Path, dest: Path) -> list[str]:
    """treehash.py's per-entry list of ROOT, without the root entry itself."""
    run([sys.executable, str(IMAGE / "treehash.py"), str(root), str(dest)])
    return [line for line in dest.read_text().splitlines() if not line.startswith(".\t")]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("debugfs") is None, reason="needs root and e2fsprogs")
def test_ext4_delta_adds_exactly_the_new_entries_to_the_base_file_system(tmp_path: Path) -> None:
    root, epoch = tmp_path / "root", 1_700_000_000
    make_tree(root)
    run(["find", str(root), "-exec", "touch", "-h", "-d", "@1600000000", "{}", "+"])
    base_list = tmp_path / "base.list"
    tree_list(root, base_list)
    ext4 = tmp_path / "root.ext4"
    run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "root_owner=0:0", "-d", str(root), str(ext4), "16M"])
    # The appliance-like change: a new package directory with files and a script, and a changed directory mtime.
    (root / "usr" / "lib" / "pkg" / "sub").mkdir(parents=True)
    (root / "usr" / "lib" / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (root / "usr" / "lib" / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(70_000))
    (root / "usr" / "bin" / "tool").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "usr" / "bin" / "tool", 0o755)
    os.symlink("/usr/bin/tool", root / "usr" / "bin" / "tool-link")
    run(["find", str(root), "-newermt", f"@{epoch}", "-exec", "touch", "-h", "-d", f"@{epoch}", "{}", "+"])
    final_list = tmp_path / "final.list"
    expected = tree_list(root, final_list)
    cmds = tmp_path / "delta.cmds"
    cmds.write_text(tool("ext4delta", base_list, final_list, root, epoch).stdout)
    assert sum(line.startswith("write ") for line in cmds.read_text().splitlines()) == 3
    out = run(["debugfs", "-w", "-f", str(cmds), str(ext4)])
    assert not [line for line in out.stderr.splitlines() if not line.startswith("debugfs ")], out.stderr
    run(["e2fsck", "-fn", str(ext4)])
    dump = tmp_path / "dump"
    dump.mkdir()
    run(["debugfs", "-R", f"rdump / {dump}", str(ext4)])
    got = tree_list(dump, tmp_path / "dump.list")
    got = [line for line in got if not line.startswith("lost+found")]
    assert got == expected
    # A base entry that disappeared cannot be expressed as additions: the tool refuses.
    (root / "etc" / "hostname").unlink()
    tree_list(root, final_list)
    refused = tool("ext4delta", base_list, final_list, root, epoch, check=False)
    assert refused.returncode == 1 and "gone from the final tree" in refused.stderr


def build_wheel(dest: Path) -> Path:
    """A minimal pure-Python wheel with a package, a data file and a console script."""
    wheel = dest / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo_pkg/__init__.py", "def main():\n    print('demo')\n")
        zf.writestr("demo_pkg/schema/v1.json", "{}\n")
        zf.writestr("demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        zf.writestr("demo_pkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo_pkg-1.0.dist-info/entry_points.txt", "[console_scripts]\ndemo = demo_pkg:main\n")
        zf.writestr("demo_pkg-1.0.dist-info/RECORD", "")
    return wheel


@pytest.mark.skipif(os.geteuid() != 0, reason="installs root-owned files")
def test_host_wheel_install_writes_record_scripts_and_checked_hash_bytecode_and_removes_cleanly(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "opt" / "app" / "lib" / ver / "site-packages"
    site.mkdir(parents=True)
    (root / "opt" / "app" / "bin").mkdir()
    wheel = build_wheel(tmp_path)
    native = tmp_path / "_native.so"  # a cross-built extension module added to the pure wheel (the recorder stage's)
    native.write_bytes(b"\x7fELF not really")
    for bad in ("demo_pkg/__init__.py", "nowhere/_native.so", "../_native.so"):
        refused = tool("install_wheel", "install", "--root", root, "--prefix", "/opt/app", "--wheel", wheel,
                       "--add", native, bad, check=False)
        assert refused.returncode == 1 and "--add" in refused.stderr, bad
        assert not any(site.iterdir()), "a refused --add installs nothing"
    tool("install_wheel", "install", "--root", root, "--prefix", "/opt/app", "--wheel", wheel,
         "--add", native, "demo_pkg/_native.so")
    assert (site / "demo_pkg" / "_native.so").read_bytes() == native.read_bytes()
    script = (root / "opt" / "app" / "bin" / "demo").read_text()
    assert script.startswith("#!/opt/app/bin/python3\n") and "from demo_pkg import main" in script
    assert os.stat(root / "opt" / "app" / "bin" / "demo").st_mode & 0o777 == 0o755
    source = site / "demo_pkg" / "__init__.py"
    pyc = Path(importlib.util.cache_from_source(str(source))).read_bytes()
    assert int.from_bytes(pyc[4:8], "little") == 0b11, "checked-hash .pyc (PEP 552): no build time inside"
    assert b"/opt/app/lib/" in pyc and str(tmp_path).encode() not in pyc, "compiled under its path on the device"
    with (site / "demo_pkg-1.0.dist-info" / "RECORD").open() as f:
        rows = {row[0]: row for row in csv.reader(f)}
    digest = base64.urlsafe_b64encode(hashlib.sha256(source.read_bytes()).digest()).rstrip(b"=").decode()
    assert rows["demo_pkg/__init__.py"][1] == f"sha256={digest}"
    assert "../../../bin/demo" in rows and "demo_pkg-1.0.dist-info/RECORD" in rows
    assert rows["demo_pkg/_native.so"][2] == str(len(native.read_bytes()))
    again = tool("install_wheel", "install", "--root", root, "--prefix", "/opt/app", "--wheel", wheel, check=False)
    assert again.returncode == 1 and "already installed" in again.stderr
    tool("install_wheel", "remove", "--root", root, "--prefix", "/opt/app", "--name", "demo-pkg")
    assert sorted(p.name for p in site.iterdir()) == []
    assert sorted(p.name for p in (root / "opt" / "app" / "bin").iterdir()) == []
