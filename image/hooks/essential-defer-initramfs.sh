#!/bin/sh
# mmdebstrap essential hook ($1 = the new root): defer update-initramfs until the customize hook. Under qemu-user one
# MODULES=most initrd takes minutes (thousands of emulated forks); the kernel install and dpkg's trigger would
# otherwise build it twice.
set -eu
root=$1
chroot "$root" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs
cat >"$root/usr/sbin/update-initramfs" <<'STUB'
#!/bin/sh
echo "update-initramfs: deferred to the end of the image's rootfs stage" >&2
STUB
chmod 0755 "$root/usr/sbin/update-initramfs"
