"""The SD-card image: partition table, clean filesystems, boot files, enabled units, an importable appliance."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.image.conftest import BUILD_TIMEOUT, REPO, Image, build, run

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT + 900)]

MIB = 1024 * 1024
UNITS_ON = {
    "multi-user.target.wants": ["appliance.service", "appliance-firstboot.service", "appliance-growroot.service",
                                "appliance-ssh.service", "systemd-networkd.service"],
    "timers.target.wants": ["appliance-upload.timer"],
    "sysinit.target.wants": ["systemd-timesyncd.service", "systemd-resolved.service"],
}


def test_partition_table_is_mbr_with_fat32_boot_and_linux_root(built_image: Image) -> None:
    table = run(["sfdisk", "--json", str(built_image.img)]).stdout
    assert '"label": "dos"' in table
    boot, root = built_image.partitions()
    assert boot["type"] == "c"  # W95 FAT32 (LBA): what the Pi's boot ROM reads
    assert root["type"] == "83"
    assert boot["start"] * 512 % (4 * MIB) == 0, "partitions start on a 4 MiB boundary (SD erase blocks)"
    assert root["start"] == boot["start"] + boot["size"]
    assert (root["start"] + root["size"]) * 512 == built_image.img.stat().st_size


def test_both_filesystems_are_fsck_clean_and_labelled(built_image: Image, tmp_path: Path) -> None:
    boot = built_image.extract_partition(1, tmp_path / "boot.vfat")
    root = built_image.extract_partition(2, tmp_path / "root.ext4")
    vfat = run(["fsck.vfat", "-n", str(boot)])
    assert "0x41" not in vfat.stdout and "dirty" not in vfat.stdout.lower()
    ext4 = run(["e2fsck", "-fn", str(root)])  # exit 0: no problem found
    assert "clean" in ext4.stdout or "files" in ext4.stdout
    assert "LABEL=\"RASPIFIRM\"" in run(["blkid", "-p", str(boot)]).stdout
    probe = run(["blkid", "-p", str(root)]).stdout
    assert 'LABEL="RASPIROOT"' in probe and f'UUID="{built_image.info["root_uuid"]}"' in probe
    assert 'TYPE="ext4"' in probe


def test_boot_partition_holds_firmware_kernel_initrd_and_pi_config(built_image: Image, tmp_path: Path) -> None:
    boot = built_image.extract_partition(1, tmp_path / "boot.vfat")
    env = dict(os.environ, MTOOLS_SKIP_CHECK="1")
    names = set(run(["mdir", "-b", "-i", str(boot), "::/"], env=env).stdout.split())
    names = {n.removeprefix("::/") for n in names}
    for firmware in ("bootcode.bin", "start4.elf", "fixup4.dat", "start.elf", "fixup.dat"):
        assert firmware in names, f"{firmware} missing from the boot partition"
    for dtb in ("bcm2837-rpi-3-b.dtb", "bcm2837-rpi-3-b-plus.dtb", "bcm2711-rpi-4-b.dtb"):
        assert dtb in names, f"device tree {dtb} missing"
    kernels = [n for n in names if n.startswith("vmlinuz-")]
    initrds = [n for n in names if n.startswith("initrd.img-")]
    assert len(kernels) == 1 and len(initrds) == 1
    config = run(["mtype", "-i", str(boot), "::/config.txt"], env=env).stdout
    assert "arm_64bit=1" in config and f"kernel={kernels[0]}" in config and f"initramfs {initrds[0]}" in config
    cmdline = run(["mtype", "-i", str(boot), "::/cmdline.txt"], env=env).stdout
    assert "root=LABEL=RASPIROOT" in cmdline and "console=ttyS1,115200" in cmdline
    assert cmdline.split()[-1] == "ro", "root must be mounted read-only first so that systemd-fsck-root checks it"
    assert "cma=" not in cmdline  # headless, and a cma= breaks the Pi 4


def test_units_enabled_and_sd_card_settings(root_tree: Path) -> None:
    etc = root_tree / "etc" / "systemd" / "system"
    for wants, units in UNITS_ON.items():
        for unit in units:
            link = etc / wants / unit
            assert link.is_symlink(), f"{unit} is not enabled ({wants})"
            target = os.readlink(link)
            assert (root_tree / target.lstrip("/")).is_file(), f"{unit} -> {target} points at nothing"
    for off in ("ssh.service", "sshd.service"):
        assert not (etc / "multi-user.target.wants" / off).exists(), "ssh must be off until provisioning enables it"
    assert not list((root_tree / "etc" / "ssh").glob("ssh_host_*")), "no SSH host key may be shared by every card"
    fstab = (root_tree / "etc" / "fstab").read_text()
    root_line = next(line for line in fstab.splitlines() if line.split()[1:2] == ["/"])
    assert "noatime" in root_line and root_line.startswith("LABEL=RASPIROOT")
    assert "swap" not in "".join(line.split("#")[0] for line in fstab.splitlines())
    journald = (root_tree / "etc" / "systemd" / "journald.conf.d" / "10-sdcard.conf").read_text()
    assert "SystemMaxUse=" in journald
    assert (root_tree / "etc" / "machine-id").read_text() == "", "each device must make its own machine-id"
    unit = (etc / "appliance.service").read_text() if (etc / "appliance.service").exists() else \
        (root_tree / "usr" / "lib" / "systemd" / "system" / "appliance.service").read_text()
    assert "StateDirectory=appliance" in unit  # the data directory is /var/lib/appliance


def test_root_file_system_is_the_recorded_root_tree(built_image: Image, root_tree: Path, tmp_path: Path) -> None:
    """The ext4 in the image (cached base file system + the debugfs delta) holds the tree root-tree.list describes."""
    run([sys.executable, str(REPO / "image" / "treehash.py"), str(root_tree), str(tmp_path / "dumped.list")])
    kinds = ("40000 ", "100000 ", "120000 ")  # debugfs rdump writes directories, files and symlinks, no device nodes

    def comparable(path: Path, skip: tuple[str, ...]) -> set[str]:
        """Directory, file and symlink lines, permission bits only (rdump drops setuid, setgid and sticky)."""
        out = set()
        for line in path.read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            rel, desc = line.split("\t", 1)
            if desc.startswith(kinds) and not line.startswith(skip):
                fields = desc.split(" ")
                fields[1] = f"{int(fields[1], 8) & 0o777:o}"
                out.add(rel + "\t" + " ".join(fields))
        return out

    # /boot/firmware's content is the FAT partition's; the root file system keeps the empty mount point.
    recorded = comparable(built_image.out / "root-tree.list", (".\t", "boot/firmware/"))
    dumped = comparable(tmp_path / "dumped.list", (".\t", "lost+found"))
    differing = sorted(recorded ^ dumped)
    assert not differing, f"{len(differing)} entries differ:\n" + "\n".join(differing[:40])
    assert len(recorded) > 20000
    part = built_image.extract_partition(2, tmp_path / "root.ext4")
    for path, mode in (("/usr/bin/passwd", "04755"), ("/tmp", "01777")):  # the bits rdump cannot show
        assert f"Mode:  {mode}" in run(["debugfs", "-R", f"stat {path}", str(part)]).stdout, path


def test_appliance_importable_by_the_images_python_under_qemu_user(root_tree: Path) -> None:
    """The image's own arm64 python3 (through binfmt/qemu-user) imports the appliance and its native deps.

    The delivery log's C recorder (cross-compiled by the recorder stage) loads and records an event there.
    """
    script = ("import platform, appliance, appliance.cli, zeroconf, uvloop, cryptography, sqlite_utils, systemd.daemon;"
              "from appliance.deliverylog.batch import LANE_WIDTHS, NativeRecorder, with_recorded;"
              "assert NativeRecorder is not None, 'no C recorder in the image';"
              "r = NativeRecorder(LANE_WIDTHS); r.routed('n1-1', 'sub', 'a/#', 1);"
              "lanes = with_recorded([[] for _ in LANE_WIDTHS], r.take());"
              "assert lanes[3][1:] == ['n1-1', 'sub', 'a/#', 1] and lanes[3][0] > 0, lanes;"
              "print(platform.machine(), zeroconf.__version__, uvloop.__version__)")
    proc = run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-ec",
                'mount --rbind /dev "$1/dev"; mount -t proc proc "$1/proc"; shift; exec chroot "$@"',
                "sh", str(root_tree), str(root_tree), "/opt/appliance/bin/python", "-c", script], timeout=600)
    machine, zc_version, _ = proc.stdout.split()
    assert machine == "aarch64"
    assert tuple(int(x) for x in zc_version.split(".")[:2]) >= (0, 132)
    check = run(["chroot", str(root_tree), "/opt/appliance/bin/python", "-m", "pip", "check"], check=False)
    assert check.returncode == 0, f"pip check in the image's venv:\n{check.stdout}{check.stderr}"
    cli = run(["chroot", str(root_tree), "/opt/appliance/bin/appliance", "--help"], check=False)
    assert cli.returncode == 0 and "run" in cli.stdout


def test_compressed_image_checksum_and_manifests(built_image: Image) -> None:
    xz = built_image.out / (built_image.img.name + ".xz")
    run(["sha256sum", "-c", xz.name + ".sha256"], cwd=built_image.out)
    raw = hashlib.sha256()
    with subprocess.Popen(["xz", "-dc", str(xz)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read(MIB), b""):
            raw.update(chunk)
    assert proc.returncode == 0
    assert raw.hexdigest() == built_image.info["image_sha256"], "the .xz does not decompress to the built image"
    assert xz.stat().st_size <= 400 * MIB, f"compressed image is {xz.stat().st_size / MIB:.0f} MiB (target 400)"
    packages = dict(line.split("\t")[0:2] for line in (built_image.out / "packages.tsv").read_text().splitlines())
    for name in ("linux-image-arm64", "raspi-firmware", "python3", "systemd", "python3-systemd"):
        assert name in packages or f"{name}:arm64" in packages, f"{name} not in the package manifest"
    wheels = dict(line.split("\t") for line in (built_image.out / "python-packages.tsv").read_text().splitlines())
    assert wheels.get("appliance") == "0.1.0" and "zeroconf" in wheels


def wheel_contents(out: Path) -> dict[str, bytes]:
    """Member name -> bytes of the appliance wheel a build made (its input from the checkout)."""
    with zipfile.ZipFile(next((out / "wheel").glob("appliance-*.whl"))) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_rebuild_from_the_same_inputs_gives_the_same_root_tree(built_image: Image, tmp_path: Path) -> None:
    """A second build (cached stages, same checkout and SOURCE_DATE_EPOCH) yields the same root tree and image."""
    if built_image.rebuild:
        out, status = built_image.rebuild
        log = built_image.out / "build-again.log"
    else:  # IMAGE_TEST_PREBUILT: build again now
        out, log = tmp_path / "again", tmp_path / "build.log"
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(built_image.info["source_date_epoch"]))
        status = build(out, log, env, "--no-compress")
    assert status == 0, log.read_text()[-4000:]
    first_wheel, second_wheel = wheel_contents(built_image.out), wheel_contents(out)
    edited = sorted(n for n in first_wheel.keys() | second_wheel.keys() if first_wheel.get(n) != second_wheel.get(n))
    if edited:  # only in a working tree others edit; a clean clone cannot change between the two builds
        pytest.skip(f"the checkout changed between the two builds: {edited[:5]}")
    first = (built_image.out / "root-tree.list").read_text().splitlines()
    second = (out / "root-tree.list").read_text().splitlines()
    differing = sorted(set(first) ^ set(second))
    assert not differing, "root trees differ:\n" + "\n".join(differing[:40])
    assert (out / "root-tree.sha256").read_text() == (built_image.out / "root-tree.sha256").read_text()
    # Same base file systems plus the same debugfs delta: the raw image is the same to the byte.
    assert (out / "appliance-arm64.img.sha256").read_text().split()[0] == built_image.info["image_sha256"]
