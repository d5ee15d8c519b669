"""Boot the provisioned image under qemu-system-aarch64 and do a QoS1 round trip with its broker from the host."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.image.conftest import BUILD_TIMEOUT, OUT, REPO, Image, run

BOOT_TIMEOUT = 15 * 60  # TCG on two shared cores: a boot that has not served in 15 minutes has failed
POWEROFF_TIMEOUT = 5 * 60
pytestmark = [pytest.mark.image, pytest.mark.slow,
              pytest.mark.timeout(BUILD_TIMEOUT + BOOT_TIMEOUT + POWEROFF_TIMEOUT + 600)]

READY = re.compile(r"Started appliance\.service")
FAILED = re.compile(r"\[FAILED\]|Failed to start|Dependency failed|Kernel panic|You are in emergency mode")
MQTT_TOPIC = "fleet/qemu-1/roundtrip"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mtools_get(boot: Path, name: str, dest: Path) -> Path:
    """Copy ::/name out of a FAT file system image."""
    run(["mcopy", "-n", "-i", str(boot), f"::/{name}", str(dest)], env=dict(os.environ, MTOOLS_SKIP_CHECK="1"))
    return dest


def provision(disk: Path, work: Path) -> str:
    """Issue one device's bundle with appliance-provision, write it into the disk's boot partition; admin password."""
    inventory = work / "inventory.csv"
    inventory.write_text("device_id,hostname,cluster,options\nqemu-1,appliance-qemu,lab,tls=no\n")
    run([str(REPO / ".venv" / "bin" / "appliance-provision"), "--inventory", str(inventory), "--out",
         str(work / "fleet"), "--write-image", str(disk)])
    users = (work / "fleet" / "ca" / "lab" / "mqtt-users.txt").read_text().splitlines()
    return next(line.split(":", 1)[1] for line in users if line.startswith("admin:"))


class Guest:
    """qemu-system-aarch64 -M virt running the image's own kernel and initrd, serial console to a file."""

    def __init__(self, disk: Path, boot: Path, work: Path) -> None:
        """Take kernel, initrd and cmdline from the image's boot partition; the Pi's UART console becomes virt's."""
        names = run(["mdir", "-b", "-i", str(boot), "::/"], env=dict(os.environ, MTOOLS_SKIP_CHECK="1")).stdout.split()
        kernel = next(n.removeprefix("::/") for n in names if "vmlinuz-" in n)
        initrd = next(n.removeprefix("::/") for n in names if "initrd.img-" in n)
        self.kernel_name = kernel
        self.kernel = mtools_get(boot, kernel, work / "vmlinuz")
        self.initrd = mtools_get(boot, initrd, work / "initrd.img")
        cmdline = mtools_get(boot, "cmdline.txt", work / "cmdline.txt").read_text().split()
        self.cmdline = " ".join([arg for arg in cmdline if not arg.startswith("console=")] + ["console=ttyAMA0"])
        self.disk, self.console, self.monitor = disk, work / "console.log", work / "monitor.sock"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        """Power on."""
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-smp", "2", "-m", "1024",
             "-kernel", str(self.kernel), "-initrd", str(self.initrd), "-append", self.cmdline,
             "-drive", f"file={self.disk},format=raw,if=virtio,cache=unsafe",
             "-nic", f"user,model=virtio-net-pci,hostfwd=tcp:127.0.0.1:{self.port}-:1883",
             "-display", "none", "-serial", f"file:{self.console}", "-monitor", f"unix:{self.monitor},server,nowait",
             "-no-reboot"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def log(self) -> str:
        """The serial console so far."""
        return self.console.read_text(errors="replace") if self.console.exists() else ""

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> float:
        """Seconds since power-on when `pattern` appeared on the console; fail on a failed unit, panic or exit."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            if pattern.search(text):
                return time.monotonic() - self.started
            if FAILED.search(text):
                pytest.fail(f"boot failed:\n{text[-6000:]}")
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                pytest.fail(f"qemu exited {self.proc.returncode}: {err}\n{text[-4000:]}")
            time.sleep(1)
        pytest.fail(f"no {pattern.pattern!r} on the console within {timeout:.0f}s:\n{self.log()[-6000:]}")

    def wait_for_connack(self, timeout: float) -> float:
        """Seconds since power-on when the forwarded port first answered an MQTT CONNECT with a CONNACK (any code).

        The serial console is no proof: systemd stops printing unit status once the serial getty owns the console.
        """
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        connect = bytes([0x10, 12, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 60, 0, 0])  # 3.1.1, clean, empty client id
        while time.monotonic() < deadline:
            if FAILED.search(self.log()):
                pytest.fail(f"boot failed:\n{self.log()[-6000:]}")
            if self.proc.poll() is not None:
                pytest.fail(f"qemu exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                    s.settimeout(20)
                    s.sendall(connect)
                    if s.recv(4)[:1] == b"\x20":
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(2)
        pytest.fail(f"no CONNACK through 127.0.0.1:{self.port} within {timeout:.0f}s:\n{self.log()[-6000:]}")

    def powerdown(self, timeout: float) -> None:
        """ACPI-less virt power button (gpio-keys): systemd shuts down cleanly; kill only after `timeout`."""
        assert self.proc is not None
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.monitor))
            s.sendall(b"system_powerdown\n")
            time.sleep(0.5)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"guest did not power off within {timeout:.0f}s:\n{self.log()[-4000:]}")

    def kill(self) -> None:
        """Stop qemu now."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def qos1_round_trip(port: int, password: str, timeout: float) -> mqtt.MQTTMessage:
    """Subscribe at QoS1, publish at QoS1 (PUBACK awaited), receive it back; the message."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"host-{uuid.uuid4().hex[:8]}",
                         protocol=mqtt.MQTTv311)
    client.username_pw_set("admin", password)
    connacks: queue.Queue[int] = queue.Queue()
    subacks: queue.Queue[list[int]] = queue.Queue()
    messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client.on_connect = lambda _c, _u, _f, rc, _p: connacks.put(rc.value)
    client.on_subscribe = lambda _c, _u, _mid, rcs, _p: subacks.put([rc.value for rc in rcs])
    client.on_message = lambda _c, _u, msg: messages.put(msg)
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    try:
        assert connacks.get(timeout=timeout) == 0, "CONNACK refused"
        client.subscribe(MQTT_TOPIC, qos=1)
        assert subacks.get(timeout=timeout) == [1], "SUBACK did not grant QoS 1"
        info = client.publish(MQTT_TOPIC, b"hello from the host", qos=1)
        info.wait_for_publish(timeout)
        assert info.is_published(), "no PUBACK"
        return messages.get(timeout=timeout)
    finally:
        client.loop_stop()
        client.disconnect()


def connect_when_serving(port: int, password: str, deadline: float) -> mqtt.MQTTMessage:
    """Retry the round trip until the forwarded port answers (user networking accepts before the guest listens)."""
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            return qos1_round_trip(port, password, timeout=60)
        except (OSError, queue.Empty, AssertionError) as exc:
            last = exc
            time.sleep(3)
    pytest.fail(f"no QoS1 round trip through 127.0.0.1:{port}: {last!r}")


def test_image_boots_to_a_serving_broker(built_image: Image, tmp_path: Path) -> None:
    """Provision a copy of the image, boot it, QoS1 round trip from the host, power off, inspect what first boot did."""
    disk = tmp_path / "sdcard.img"
    shutil.copyfile(built_image.img, disk)
    size = disk.stat().st_size
    os.truncate(disk, size + 1024 * 1024 * 1024)  # a bigger "card": first boot must grow the root partition into it
    password = provision(disk, tmp_path)
    card = Image(out=tmp_path, img=disk, info={})
    guest = Guest(disk, card.extract_partition(1, tmp_path / "boot.vfat"), tmp_path)
    OUT.mkdir(parents=True, exist_ok=True)
    guest.start()
    try:
        ready_s = guest.wait_for_connack(BOOT_TIMEOUT)
        message = connect_when_serving(guest.port, password, time.monotonic() + 300)
        served_s = time.monotonic() - guest.started
        assert message.topic == MQTT_TOPIC and message.payload == b"hello from the host" and message.qos == 1
        (OUT / "boot-timing.json").write_text(json.dumps(
            {"ready_s": round(ready_s, 1), "first_round_trip_s": round(served_s, 1), "kernel": guest.kernel_name}))
        print(f"boot to appliance.service ready: {ready_s:.1f}s, first QoS1 round trip: {served_s:.1f}s")
        guest.powerdown(POWEROFF_TIMEOUT)
    finally:
        guest.kill()
        (OUT / "boot-console.log").write_text(guest.log())
    assert "reboot: Power down" in guest.log()

    # After a clean power-off: root grown to the whole card, both file systems clean, bundle moved off the FAT.
    after = card
    root_part = after.partitions()[1]
    assert (root_part["start"] + root_part["size"]) * 512 == disk.stat().st_size, "root partition was not grown"
    root = after.extract_partition(2, tmp_path / "root-after.ext4")
    run(["e2fsck", "-fn", str(root)])
    blocks = int(re.search(r"Block count:\s+(\d+)", run(["dumpe2fs", "-h", str(root)]).stdout).group(1))
    assert blocks * 4096 > size - built_image.partitions()[1]["start"] * 512, "root file system was not resized"
    listing = run(["debugfs", "-R", "ls -l /etc/appliance", str(root)]).stdout
    assert "appliance.toml" in listing
    data = run(["debugfs", "-R", "ls -l /var/lib/appliance", str(root)]).stdout
    assert "File not found" not in data
    boot_after = after.extract_partition(1, tmp_path / "boot-after.vfat")
    run(["fsck.vfat", "-n", str(boot_after)])
    mtools_env = dict(os.environ, MTOOLS_SKIP_CHECK="1")
    gone = run(["mdir", "-i", str(boot_after), "::/appliance"], check=False, env=mtools_env)
    assert gone.returncode != 0, "first boot left the provisioning bundle on the FAT partition"
