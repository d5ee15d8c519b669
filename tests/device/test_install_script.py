"""scripts/install-appliance.sh for real in a Debian bookworm chroot: venv, user, directories, units, verify."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from provisioning.cli import main as provision

from .chroot import bookworm_tree, in_chroot, install_appliance

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = "python3,python3-venv,python3-systemd,python3-wsproto,python3-cffi,systemd"
UNITS = ["appliance.service", "appliance-upload.service", "appliance-upload.timer", "appliance-firstboot.service"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # a cold cache builds the Debian tree first (minutes on 2 shared cores)
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mmdebstrap") is None, reason="needs root and mmdebstrap"),
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("install")
    root = work / "root"
    bookworm_tree(root, PACKAGES)
    args = install_appliance(root)
    first = in_chroot(root, *args)
    assert first.returncode == 0, first.stderr
    again = in_chroot(root, *args)  # idempotent: a second run (an upgrade) succeeds and changes nothing it shouldn't
    assert again.returncode == 0, again.stderr
    return root


def test_venv_user_directories(installed: Path) -> None:
    root = installed
    proc = in_chroot(root, "/opt/appliance/bin/appliance", "--help")
    assert proc.returncode == 0 and "run" in proc.stdout
    proc = in_chroot(root, "/opt/appliance/bin/python", "-c", "import systemd.daemon, cryptography, appliance.cli")
    assert proc.returncode == 0, proc.stderr
    passwd = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    user = passwd["appliance"]
    assert user[6] == "/usr/sbin/nologin" and int(user[2]) < 1000
    etc = (root / "etc/appliance").stat()
    assert (stat.S_IMODE(etc.st_mode), etc.st_uid, etc.st_gid) == (0o750, 0, int(user[3]))
    secrets = (root / "etc/appliance/secrets").stat()
    assert (stat.S_IMODE(secrets.st_mode), secrets.st_uid) == (0o700, int(user[2]))
    assert os.readlink(root / "usr/local/bin/appliance") == "/opt/appliance/bin/appliance"
    ssh_dir = (root / "root/.ssh").stat()  # where first boot may put authorized_keys (ssh=yes)
    assert (stat.S_IMODE(ssh_dir.st_mode), ssh_dir.st_uid) == (0o700, 0)


def test_units_installed_enabled_and_verify_clean_in_place(installed: Path) -> None:
    root = installed
    for unit in UNITS:
        assert (root / "usr/lib/systemd/system" / unit).read_text() == (ROOT / "systemd" / unit).read_text()
    wants = {"multi-user.target.wants": ["appliance.service", "appliance-firstboot.service"],
             "timers.target.wants": ["appliance-upload.timer"]}
    for target, units in wants.items():
        for unit in units:
            link = root / "etc/systemd/system" / target / unit
            # bookworm's systemctl names the merged-/usr alias /lib/systemd/system: the same file
            assert os.readlink(link) in (f"/usr/lib/systemd/system/{unit}", f"/lib/systemd/system/{unit}"), link
    # Here /opt/appliance/bin exists for real: verify the installed units unmodified, inside the device's tree.
    proc = in_chroot(root, "systemd-analyze", "verify", *(f"/usr/lib/systemd/system/{u}" for u in UNITS))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_first_boot_then_the_broker_user_can_read_its_identity(installed: Path, tmp_path: Path) -> None:
    root = installed
    csv_path = tmp_path / "fleet.csv"
    csv_path.write_text("device_id,hostname,cluster,options\npi-9,node-9,lab,\n")
    assert provision(["--inventory", str(csv_path), "--out", str(tmp_path / "out")]) == 0
    boot = root / "boot/firmware/appliance"
    boot.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tmp_path / "out/bundles/pi-9", boot)
    # The unit's own command line, in the device's tree.
    exec_start = next(line.split("=", 1)[1] for line in (ROOT / "systemd/appliance-firstboot.service").read_text()
                      .splitlines() if line.startswith("ExecStart="))
    proc = in_chroot(root, *exec_start.split())
    assert proc.returncode == 0, proc.stderr
    assert not boot.exists()
    check = ("from pathlib import Path\n"
             "from appliance.server.config import load\n"
             "c = load(Path('/etc/appliance/appliance.toml'))\n"
             "for key in ('password_file', 'acl_file'): Path(c.get('auth', key)).read_bytes()\n"
             "for key in ('certfile', 'keyfile', 'cafile'): Path(c.get('listener', key)).read_bytes()\n"
             "Path(c.extra['cluster']['secret_file']).read_bytes()\n"
             "print(c.node_name)\n")
    proc = in_chroot(root, "/opt/appliance/bin/python", "-c", check, user="appliance:appliance")
    assert proc.returncode == 0 and proc.stdout.strip() == "node-9", proc.stderr
    # ... and nobody else can read the secrets.
    proc = in_chroot(root, "/opt/appliance/bin/python", "-c",
                     "open('/etc/appliance/secrets/node.key').read()", user="nobody:nogroup")
    assert proc.returncode != 0 and "Permission denied" in proc.stderr
