"""A bundle written into a real disk image's FAT partition with mtools reads back identical; first boot applies it."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.server.config import load
from provisioning.cli import main

ROOT = Path(__file__).resolve().parents[2]
SECTOR = 512
FAT_START, FAT_SECTORS = 2048, 131072  # 1 MiB offset, a 64 MiB FAT32 partition, as on a Raspberry Pi card
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("sfdisk", "mkfs.vfat", "mcopy")),
                                reason="needs fdisk, dosfstools and mtools")


def make_image(path: Path) -> None:
    """An MBR disk image: FAT32 boot partition (built in its own file, then dd'ed in) and a Linux partition."""
    subprocess.run(["truncate", "-s", "80M", str(path)], check=True)
    layout = f"label: dos\nstart={FAT_START}, size={FAT_SECTORS}, type=c\nstart={FAT_START + FAT_SECTORS}, type=83\n"
    subprocess.run(["sfdisk", "-q", str(path)], input=layout.encode(), check=True, capture_output=True)
    fat = path.with_suffix(".fat")
    subprocess.run(["truncate", "-s", str(FAT_SECTORS * SECTOR), str(fat)], check=True)
    subprocess.run(["mkfs.vfat", "-F", "32", "-n", "BOOT", str(fat)], check=True, capture_output=True)
    subprocess.run(["dd", f"if={fat}", f"of={path}", f"bs={SECTOR}", f"seek={FAT_START}", "conv=notrunc,sparse",
                    "status=none"], check=True)
    fat.unlink()


def region_hash(path: Path, start: int, end: int | None = None) -> str:
    with path.open("rb") as handle:
        handle.seek(start)
        return hashlib.sha256(handle.read(None if end is None else end - start)).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def provisioned(tmp_path: Path) -> tuple[Path, Path]:
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text("device_id,hostname,cluster,options\npi-000,node-000,lab,\npi-001,node-001,lab,ws=yes\n")
    out = tmp_path / "out"
    assert main(["--inventory", str(csv_path), "--out", str(out), "--upload", "s3://logs/x"]) == 0
    return csv_path, out


def test_bundle_into_image_reads_back_identical(tmp_path: Path, provisioned: tuple[Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    _, out = provisioned
    img = tmp_path / "card.img"
    make_image(img)
    offset = FAT_START * SECTOR
    outside = (region_hash(img, 0, offset), region_hash(img, offset + FAT_SECTORS * SECTOR))

    assert main(["--out", str(out), "--write-image", str(img), "--device", "pi-001"]) == 0
    extracted = tmp_path / "extracted"
    extracted.mkdir()
    subprocess.run(["mcopy", "-s", "-n", "-i", f"{img}@@{offset}", "::/appliance", str(extracted)], check=True,
                   env=dict(os.environ, MTOOLS_SKIP_CHECK="1"))
    bundle = out / "bundles" / "pi-001"
    assert tree(extracted / "appliance") == tree(bundle)  # every file, byte for byte
    assert len(tree(bundle)) >= 8
    assert region_hash(img, 0, offset) == outside[0]  # MBR and gap untouched ...
    assert region_hash(img, offset + FAT_SECTORS * SECTOR) == outside[1]  # ... and so is the root partition
    part = tmp_path / "part.fat"
    subprocess.run(["dd", f"if={img}", f"of={part}", f"bs={SECTOR}", f"skip={FAT_START}", f"count={FAT_SECTORS}",
                    "status=none"], check=True)
    # fsck.vfat takes no offset: check a copy of the partition.
    check = subprocess.run(["fsck.vfat", "-n", str(part)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    # A second bundle is refused unless --force; with --force the other device's bundle replaces it.
    capsys.readouterr()
    assert main(["--out", str(out), "--write-image", str(img), "--device", "pi-000"]) == 1
    assert "already holds a bundle" in capsys.readouterr().err
    assert main(["--out", str(out), "--write-image", str(img), "--device", "pi-000", "--force"]) == 0
    again = tmp_path / "again"
    again.mkdir()
    subprocess.run(["mcopy", "-s", "-n", "-i", f"{img}@@{offset}", "::/appliance", str(again)], check=True,
                   env=dict(os.environ, MTOOLS_SKIP_CHECK="1"))
    assert tree(again / "appliance") == tree(out / "bundles" / "pi-000")


def test_image_without_fat_partition_is_refused(tmp_path: Path, provisioned: tuple[Path, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _, out = provisioned
    img = tmp_path / "linux-only.img"
    subprocess.run(["truncate", "-s", "8M", str(img)], check=True)
    subprocess.run(["sfdisk", "-q", str(img)], input=b"label: dos\nstart=2048, type=83\n", check=True)
    assert main(["--out", str(out), "--write-image", str(img), "--device", "pi-000"]) == 1
    assert "no FAT partition" in capsys.readouterr().err
    assert main(["--out", str(out), "--write-image", str(tmp_path / "missing.img"), "--device", "pi-000"]) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="first boot hands files to another user: needs root")
def test_first_boot_installs_bundle_and_wipes_it(tmp_path: Path, provisioned: tuple[Path, Path]) -> None:
    _, out = provisioned
    boot = tmp_path / "boot" / "appliance"
    shutil.copytree(out / "bundles" / "pi-000", boot)
    etc = tmp_path / "etc" / "appliance"
    nobody = pwd.getpwnam("nobody")
    proc = firstboot(boot, etc, "nobody")
    assert proc.returncode == 0, proc.stderr
    assert not boot.exists()  # gone from the boot partition
    bundle = tree(out / "bundles" / "pi-000")
    installed = tree(etc)
    assert {k: v for k, v in installed.items() if k != "provisioned.json"} == \
        {k: v for k, v in bundle.items() if k != "bundle.json"}
    for rel in installed:
        st = (etc / rel).stat()
        if rel.startswith("secrets/"):
            assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, nobody.pw_uid), rel
        elif rel.endswith(".crt") or rel == "provisioned.json":
            assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o644, 0), rel
        else:
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, nobody.pw_gid), rel
    assert stat.S_IMODE((etc / "secrets").stat().st_mode) == 0o700
    record = json.loads((etc / "provisioned.json").read_text())
    assert record["device_id"] == "pi-000" and "PRIVATE" not in (etc / "provisioned.json").read_text()
    text = (etc / "appliance.toml").read_text().replace("/etc/appliance", str(etc))
    (tmp_path / "device.toml").write_text(text)
    assert load(tmp_path / "device.toml").node_name == "node-000"
    # Nothing left to do on the next boot.
    assert firstboot(boot, etc, "nobody").returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="first boot hands files to another user: needs root")
def test_first_boot_refuses_an_altered_bundle(tmp_path: Path, provisioned: tuple[Path, Path]) -> None:
    _, out = provisioned
    boot = tmp_path / "boot" / "appliance"
    shutil.copytree(out / "bundles" / "pi-000", boot)
    key = boot / "secrets" / "passwd"
    key.write_bytes(key.read_bytes()[:-2] + b"x\n")
    etc = tmp_path / "etc" / "appliance"
    proc = firstboot(boot, etc, "nobody")
    assert proc.returncode == 1 and "differs from bundle.json" in proc.stderr
    assert boot.is_dir() and not etc.exists()  # nothing installed, the bundle stays for the operator
    (boot / "secrets" / "passwd").unlink()
    proc = firstboot(boot, etc, "nobody")
    assert proc.returncode == 1 and "missing" in proc.stderr


def firstboot(bundle: Path, etc: Path, user: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioning.firstboot", "--bundle", str(bundle), "--etc", str(etc),
                           "--user", user, *extra], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="first boot hands files to another user: needs root")
def test_first_boot_installs_ssh_keys_only_when_the_bundle_has_them(tmp_path: Path) -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFkLQ3mFq1cQ0bD2JbJ9S0xqv8c0S4Hj0d3a0bKq9vJr ops\n"
    (tmp_path / "ops.pub").write_text(key)
    (tmp_path / "fleet.csv").write_text("device_id,hostname,cluster,options\na,node-a,lab,ssh=yes\nb,node-b,lab,\n")
    out = tmp_path / "out"
    assert main(["--inventory", str(tmp_path / "fleet.csv"), "--out", str(out),
                 "--ssh-authorized-keys", str(tmp_path / "ops.pub")]) == 0
    for device, expect in (("a", True), ("b", False)):
        home = tmp_path / f"home-{device}"
        home.mkdir()
        boot = tmp_path / f"boot-{device}" / "appliance"
        shutil.copytree(out / "bundles" / device, boot)
        # --ssh-unit '': install the keys but leave this machine's services alone (the boot test enables sshd).
        proc = firstboot(boot, tmp_path / f"etc-{device}", "nobody", "--ssh-home", str(home), "--ssh-unit", "")
        assert proc.returncode == 0, proc.stderr
        keys = home / ".ssh" / "authorized_keys"
        assert keys.exists() == expect
        if expect:
            assert keys.read_text() == key and stat.S_IMODE(keys.stat().st_mode) == 0o600
            assert stat.S_IMODE((home / ".ssh").stat().st_mode) == 0o700
        assert json.loads((tmp_path / f"etc-{device}" / "provisioned.json").read_text())["ssh"] == expect
        assert not (tmp_path / f"etc-{device}" / "ssh").exists()
