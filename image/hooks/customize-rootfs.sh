#!/bin/sh
# mmdebstrap customize hook ($1 = the new root): Raspberry Pi boot settings, then the one initrd and /boot/firmware.
set -eu
root=$1
# raspi-firmware reads these when it writes cmdline.txt / config.txt. Left on "auto" it would probe the build
# machine's /dev and /proc; an image must name its root by label and its consoles explicitly.
cat >>"$root/etc/default/raspi-firmware" <<'CONF'

# Set by image/hooks/customize-rootfs.sh (appliance SD-card image).
ROOTPART=LABEL=RASPIROOT
# Pi 3/4 UART (mini UART) is ttyS1; the last console gets the boot log. Headless: no CMA pool for a GPU.
CONSOLES="tty0 ttyS1,115200"
CMA=0
CONF
# Undo essential-defer-initramfs.sh, then build the initrd once; its post-update hook (raspi-firmware) copies
# kernel, initrd, DTBs and firmware to /boot/firmware and writes config.txt and cmdline.txt.
rm -f "$root/usr/sbin/update-initramfs"
chroot "$root" dpkg-divert --quiet --local --rename --remove /usr/sbin/update-initramfs
chroot "$root" update-initramfs -c -k all
chroot "$root" env DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware
grep -q 'root=LABEL=RASPIROOT' "$root/boot/firmware/cmdline.txt"
ls "$root"/boot/firmware/initrd.img-* "$root"/boot/firmware/vmlinuz-* >/dev/null
