"""Vagrantfile: `vagrant validate` passes, and the VMs are installed by the same script as the SD-card image."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioning.inventory import parse_inventory

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "scripts/install-appliance.sh"


def validate(vagrantfile_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run `vagrant validate` on a copy (so no .vagrant/ appears in the checkout).

    No provider (VirtualBox, libvirt) is installed here, and `vagrant validate` would stop at choosing one, so it runs
    with --ignore-provider: every other setting (boxes, networks, synced folders, provisioners, triggers) is checked.
    """
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "Vagrantfile").write_text(vagrantfile_text)
    env = dict(os.environ, VAGRANT_CWD=str(project), VAGRANT_HOME=str(tmp_path / "vagrant.d"),
               VAGRANT_CHECKPOINT_DISABLE="1", VAGRANT_NO_COLOR="1")
    return subprocess.run(["vagrant", "validate", "--ignore-provider"], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="needs Debian's vagrant package (scripts/setup.sh)")
def test_vagrant_validate(tmp_path: Path) -> None:
    proc = validate((ROOT / "Vagrantfile").read_text(), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout
    for node in ("node1", "node2", "node3"):
        assert f"{node}: Ignoring provider config" in proc.stdout  # three machines defined


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="needs Debian's vagrant package (scripts/setup.sh)")
def test_vagrant_validate_can_fail(tmp_path: Path) -> None:
    broken = (ROOT / "Vagrantfile").read_text().replace('config.vm.box = "debian/bookworm64"',
                                                        'config.vm.box = "debian/bookworm64"\n  config.vm.boxx = 1')
    proc = validate(broken, tmp_path)
    assert proc.returncode != 0 and "boxx" in proc.stdout + proc.stderr


def test_vagrant_and_image_use_the_same_install_script() -> None:
    vagrantfile = (ROOT / "Vagrantfile").read_text()
    image_files = [p for p in (ROOT / "image").rglob("*") if p.is_file() and p.suffix in ("", ".sh")]
    image_text = "\n".join(p.read_text(errors="replace") for p in image_files)
    assert (ROOT / INSTALL).is_file() and os.access(ROOT / INSTALL, os.X_OK)
    assert re.search(r"^\s*/vagrant/scripts/install-appliance\.sh ", vagrantfile, re.M), "Vagrant must run it"
    assert re.search(r"scripts/install-appliance\.sh", image_text), "the image build must run it"
    # ... and neither installs the appliance another way: no pip install of it, no enabling of its units by hand.
    for name, text in (("Vagrantfile", vagrantfile), ("image/", image_text)):
        assert not re.search(r"pip3?\s+install[^\n]*\b(appliance|\.whl|/vagrant)\b", text), name
        assert not re.search(r"systemctl[^\n]*\benable\b[^\n]*appliance(\.service|-upload|-firstboot)", text), name
    # The VMs get their identity the way devices do: appliance-provision's bundle through the first-boot unit.
    assert "appliance-provision" in vagrantfile and "/boot/firmware/appliance" in vagrantfile
    assert "appliance-firstboot.service" in vagrantfile


@pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby (vagrant depends on it)")
def test_vagrant_inventory_is_valid_for_appliance_provision(tmp_path: Path) -> None:
    stub = tmp_path / "inventory.rb"
    stub.write_text("module Vagrant\n  def self.configure(_v); end\nend\nload ARGV[0]\nprint INVENTORY\n")
    text = subprocess.run(["ruby", str(stub), str(ROOT / "Vagrantfile")], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    devices = parse_inventory(text)
    assert [d.hostname for d in devices] == ["node1", "node2", "node3"]
    assert {d.cluster for d in devices} == {"vagrant"}
