"""Boot Debian bookworm under qemu with real systemd: provisioned by the first-boot unit, the hardened broker unit
reaches READY, enforces provisioned auth, logs structured fields to journald, and is restarted by the watchdog."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess

import pytest

from provisioning.cli import main as provision

from .chroot import bookworm_tree, in_chroot, install_appliance

PACKAGES = ("linux-image-amd64,initramfs-tools,systemd-sysv,udev,kmod,iproute2,openssh-server,"
            "python3,python3-venv,python3-systemd,python3-wsproto,python3-cffi")
QEMU = "qemu-system-x86_64"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFkLQ3mFq1cQ0bD2JbJ9S0xqv8c0S4Hj0d3a0bKq9vJr operator\n"
# The shipped WatchdogSec=30 would make the test wait half a minute; the drop-in only shortens it.
WATCHDOG_DROPIN = "[Service]\nWatchdogSec=4\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a cold cache builds the Debian tree first (minutes on 2 shared cores)
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mmdebstrap") or not shutil.which(QEMU),
                       reason="needs root, mmdebstrap and qemu-system-x86"),
]

# Runs on the booted machine after appliance.service; reports on the serial console, then powers off.
PROBE = r"""#!/bin/sh
say() { echo "PROBE $*"; }
wait_active() {
  for i in $(seq 1 90); do [ "$(systemctl is-active appliance.service)" = active ] && return; sleep 1; done
}
wait_active
say "active=$(systemctl is-active appliance.service)"
say "firstboot=$(systemctl is-active appliance-firstboot.service)"
say "bundle_dir=$(test -e /boot/firmware/appliance && echo present || echo gone)"
say "status=$(systemctl show -p StatusText --value appliance.service)"
say "restarts=$(systemctl show -p NRestarts --value appliance.service)"
say "user=$(stat -c %U "/proc/$(systemctl show -p MainPID --value appliance.service)")"
say "key=$(stat -c '%U:%a' /etc/appliance/secrets/node.key)"
for i in $(seq 1 60); do [ "$(systemctl is-active ssh.service)" = active ] && break; sleep 1; done
say "ssh=$(systemctl is-enabled ssh.service)/$(systemctl is-active ssh.service)"
say "ssh_keys=$(stat -c '%U:%a' /root/.ssh/authorized_keys):$(sha256sum </root/.ssh/authorized_keys | cut -c1-16)"
say "port22=$(ss -Hltn 'sport = :22' | wc -l)"
/opt/appliance/bin/python - <<'PY'
import socket, struct
pw = open("/root/admin.pw").read().strip().encode()
def connack(user, password):
    flags = 0xC2 if user else 0x02
    body = b"\x00\x04MQTT\x04" + bytes([flags]) + b"\x00\x3c\x00\x00"
    if user:
        body += struct.pack("!H", len(user)) + user + struct.pack("!H", len(password)) + password
    with socket.create_connection(("127.0.0.1", 1883), timeout=20) as s:
        s.sendall(bytes([0x10, len(body)]) + body)
        return s.recv(4).hex()
print("PROBE connack_admin=" + connack(b"admin", pw))
print("PROBE connack_anonymous=" + connack(None, None))
print("PROBE connack_wrong=" + connack(b"admin", b"wrong"))
PY
journalctl SYSLOG_IDENTIFIER=appliance -o verbose --no-pager | grep -E '^ +(LOGGER|CODE_FUNC)=' | sort -u |
  sed 's/^ */PROBE field /'
pid=$(systemctl show -p MainPID --value appliance.service)
kill -STOP "$pid"
say "frozen=$pid"
sleep 10
wait_active
say "after_pid=$(systemctl show -p MainPID --value appliance.service)"
say "after_restarts=$(systemctl show -p NRestarts --value appliance.service)"
journalctl -u appliance.service -o cat --no-pager | grep -q 'Watchdog timeout' && say "watchdog_fired=yes"
systemctl --failed --no-legend --plain | sed 's/^/PROBE failed /'
journalctl -u appliance-firstboot.service -o cat --no-pager | sed 's/^/PROBE firstboot_log /'
say done
systemctl poweroff
"""

PROBE_UNIT = """[Unit]
Description=test probe
After=appliance.service
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/appliance-probe
StandardOutput=tty
TTYPath=/dev/ttyS0
[Install]
WantedBy=multi-user.target
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    work = tmp_path_factory.mktemp("boot")
    root = work / "root"
    bookworm_tree(root, PACKAGES)
    proc = in_chroot(root, *install_appliance(root))
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(root / "tmp" / "ia")
    # Provisioned like a device: the bundle where the SD card's boot partition is mounted.
    # ssh is off in the tree (as in the image); provisioning with ssh=yes is what turns it on.
    subprocess.run(["systemctl", f"--root={root}", "--quiet", "disable", "ssh.service", "ssh.socket"], check=True)
    (work / "ops.pub").write_text(SSH_KEY)
    (work / "fleet.csv").write_text("device_id,hostname,cluster,options\nvm-1,vm-node-1,lab,ssh=yes\n")
    assert provision(["--inventory", str(work / "fleet.csv"), "--out", str(work / "out"),
                      "--ssh-authorized-keys", str(work / "ops.pub")]) == 0
    (root / "boot/firmware").mkdir(parents=True, exist_ok=True)
    shutil.copytree(work / "out/bundles/vm-1", root / "boot/firmware/appliance")
    admin = next(line.split(":", 1)[1] for line in (work / "out/ca/lab/mqtt-users.txt").read_text().splitlines()
                 if line.startswith("admin:"))
    (root / "root/admin.pw").write_text(admin + "\n")
    (root / "etc/hostname").write_text("vm-node-1\n")
    dropin = root / "etc/systemd/system/appliance.service.d"
    dropin.mkdir(parents=True)
    (dropin / "10-test-watchdog.conf").write_text(WATCHDOG_DROPIN)
    (root / "usr/local/sbin/appliance-probe").write_text(PROBE)
    (root / "usr/local/sbin/appliance-probe").chmod(0o755)
    (root / "etc/systemd/system/appliance-probe.service").write_text(PROBE_UNIT)
    (root / "etc/systemd/system/multi-user.target.wants/appliance-probe.service").symlink_to(
        "/etc/systemd/system/appliance-probe.service")
    disk = work / "disk.img"
    subprocess.run(["mkfs.ext4", "-q", "-d", str(root), "-L", "root", str(disk), "2G"], check=True, timeout=600)
    kernel = next((root / "boot").glob("vmlinuz-*"))
    initrd = next((root / "boot").glob("initrd.img-*"))
    serial = work / "serial.log"
    with serial.open("wb") as out:
        subprocess.run([QEMU, "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "2", "-kernel", str(kernel),
                        "-initrd", str(initrd), "-append", "root=/dev/vda rw console=ttyS0 quiet",
                        "-drive", f"file={disk},if=virtio,format=raw", "-nographic", "-nic", "none", "-no-reboot"],
                       stdout=out, stderr=subprocess.STDOUT, timeout=900, check=False)
    report: dict[str, list[str]] = {}
    for line in serial.read_bytes().decode(errors="replace").splitlines():
        match = re.search(r"PROBE (\w+)(?:[= ](.*))?$", line.strip())
        if match:
            report.setdefault(match.group(1), []).append((match.group(2) or "").strip())
    assert "done" in report, serial.read_bytes().decode(errors="replace")[-4000:]
    return report


def one(report: dict[str, list[str]], key: str) -> str:
    assert key in report, report
    return report[key][0]


def test_first_boot_applied_the_bundle_and_removed_it(probe: dict[str, list[str]]) -> None:
    assert one(probe, "firstboot") == "active", "\n".join(probe.get("firstboot_log", []))
    assert one(probe, "bundle_dir") == "gone"
    assert one(probe, "key") == "appliance:600"


def test_ssh_enabled_by_provisioning(probe: dict[str, list[str]]) -> None:
    """Off in the tree, on after first boot because the bundle asked for it, with exactly the operator's key."""
    assert one(probe, "ssh") == "enabled/active"
    digest = hashlib.sha256(SSH_KEY.encode()).hexdigest()[:16]
    assert one(probe, "ssh_keys") == f"root:600:{digest}"
    assert one(probe, "port22") != "0"


def test_hardened_broker_reaches_ready_as_its_own_user(probe: dict[str, list[str]]) -> None:
    assert one(probe, "active") == "active"  # Type=notify: active means READY=1 arrived
    assert re.match(r"\d+ clients, \d+ sessions", one(probe, "status"))  # STATUS= from the broker
    assert one(probe, "restarts") == "0"
    assert one(probe, "user") == "appliance"
    assert not [unit for unit in probe.get("failed", []) if "appliance" in unit], probe.get("failed")


def test_provisioned_credentials_are_enforced(probe: dict[str, list[str]]) -> None:
    assert one(probe, "connack_admin") == "20020000"  # accepted
    assert one(probe, "connack_anonymous") == "20020005"  # not authorised: allow_anonymous = false
    assert one(probe, "connack_wrong") == "20020004"  # bad user name or password


def test_journald_gets_structured_fields(probe: dict[str, list[str]]) -> None:
    fields = probe.get("field", [])
    assert any(f.startswith("LOGGER=appliance") for f in fields), fields
    assert any(f.startswith("CODE_FUNC=") for f in fields), fields


def test_a_frozen_broker_is_killed_by_the_watchdog_and_restarted(probe: dict[str, list[str]]) -> None:
    assert one(probe, "watchdog_fired") == "yes"
    assert int(one(probe, "after_restarts")) >= 1
    assert one(probe, "after_pid") not in (one(probe, "frozen"), "0")
