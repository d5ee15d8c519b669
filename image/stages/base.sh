# shellcheck shell=bash
# Stage base: the device without the appliance's own code. Unpack the rootfs, run scripts/install-appliance.sh in the
# qemu-user chroot (venv, dependencies, user, units), apply the SD-card settings, then take the appliance package back
# out. Cached as the tree (tarball + tree list) and as the boot and root file systems built from it, so a change to
# the appliance code only adds its files to copies of these (stages configure and disk).

stage_base() {
  stage_begin base
  local deps key dir bundle=/tmp/appliance-install
  # What the base depends on besides its input files: the wheel's dependency metadata (not its code).
  deps=$(python3 -c 'import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
print(wheel.read(meta).decode())' "$APPLIANCE_WHEEL" | grep -E '^(Requires-Dist|Requires-Python|Provides-Extra):')
  key=$(hash_inputs "s:$(basename "$ROOTFS_TAR")" "s:$(basename "$WHEELHOUSE")" "s:$deps" "s:$HOST_PYTHON" \
    "$REPO/scripts/install-appliance.sh" "$REPO/systemd" "$IMAGE_DIR/files" "$IMAGE_DIR/config.sh" "$IMAGE_DIR/lib.sh" \
    "$IMAGE_DIR/stages/base.sh" "$IMAGE_DIR/install_wheel.py" "$IMAGE_DIR/treehash.py")
  dir=$CACHE/base-$key
  BASE=$dir
  if [ -f "$dir/root.tar" ]; then
    stage_end "cached $(basename "$dir")"
    return
  fi
  rm -rf "$dir.part" "$WORK"
  mkdir -p "$dir.part" "$ROOT"
  log "unpacking $(basename "$ROOTFS_TAR")"
  tar -xpf "$ROOTFS_TAR" -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*'

  # Image settings (fstab, journald, network, growroot, ssh host keys on first start): files owned by root.
  cp -r --no-preserve=ownership --preserve=mode "$IMAGE_DIR/files/." "$ROOT/"

  # The one install script Vagrant uses too, fed from local files only: our wheel and the pinned wheelhouse.
  [ -f "$REPO/scripts/install-appliance.sh" ] || die "scripts/install-appliance.sh is missing (systemd/ integration)"
  mkdir -p "$ROOT$bundle/wheels"
  cp "$APPLIANCE_WHEEL" "$ROOT$bundle/"
  cp "$WHEELHOUSE"/*.whl "$ROOT$bundle/wheels/"
  cp -r "$REPO/scripts" "$REPO/systemd" "$ROOT$bundle/"
  log "scripts/install-appliance.sh in the arm64 chroot (qemu-user)"
  if ! in_chroot "$ROOT" /bin/sh "$bundle/scripts/install-appliance.sh" \
    --wheel "$bundle/$(basename "$APPLIANCE_WHEEL")" --wheelhouse "$bundle/wheels" --prefix "$APPLIANCE_PREFIX" 2>&1 |
    sed -u 's/^/    /' >&2; then
    die "scripts/install-appliance.sh failed in the chroot"
  fi
  rm -rf "${ROOT:?}$bundle"

  apply_sdcard_settings
  # raspi-firmware's hook rewrites cmdline.txt from /etc/default (now with raspi-extra-cmdline's "ro"): root is
  # mounted read-only by the initrd, checked by systemd-fsck-root, then remounted rw from fstab.
  in_chroot "$ROOT" env DEB_MAINT_PARAMS=configure /etc/kernel/postinst.d/z50-raspi-firmware
  grep -q ' ro *$' "$ROOT/boot/firmware/cmdline.txt" || die "cmdline.txt does not end in ro: $(cat "$ROOT/boot/firmware/cmdline.txt")"
  rm -rf "${ROOT:?}"/tmp/* "$ROOT"/var/tmp/* "$ROOT"/root/.cache "$ROOT"/var/cache/apt/*.bin
  find "$ROOT/var/log" -type f \( -name '*.log' -o -name 'lastlog' -o -name 'faillog' \) -size +0 -delete 2>/dev/null || true

  # May the host's python byte-compile the appliance? Only if it compiles this wheel's sources to the same code
  # objects as the image's python just did through pip (otherwise stage configure compiles under qemu-user).
  if "$HOST_PYTHON" "$IMAGE_DIR/install_wheel.py" same-bytecode --root "$ROOT" --prefix "$APPLIANCE_PREFIX" \
    --name appliance; then
    "$HOST_PYTHON" -c 'import sys; print(sys.version)' >"$dir.part/host-python"
  fi
  "$HOST_PYTHON" "$IMAGE_DIR/install_wheel.py" remove --root "$ROOT" --prefix "$APPLIANCE_PREFIX" --name appliance

  # Everything this stage wrote gets the rootfs's fixed time: the base does not depend on when it was built.
  clamp_mtimes "$ROOT" "$ROOTFS_EPOCH"
  tree_hash "$ROOT" "$dir.part/root.list" >"$dir.part/root.sha256"
  dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f='${binary:Package}\t${Version}\t${Architecture}\n' |
    LC_ALL=C sort >"$dir.part/packages.tsv"
  tar -C "$ROOT" --sort=name --numeric-owner --xattrs --xattrs-include='*' -cf "$dir.part/root.tar" .
  base_filesystems "$dir.part"
  rm -rf "$WORK"
  mv "$dir.part" "$dir"
  find "$CACHE" -maxdepth 1 -name 'base-*' ! -name "$(basename "$dir")" -exec rm -rf {} +
  stage_end "built $(basename "$dir"), root tree $(cut -c1-16 "$dir/root.sha256")"
}

# apply_sdcard_settings: services on/off (host systemctl --root: nothing runs), no swap, no shared SSH keys.
apply_sdcard_settings() {
  systemctl --root="$ROOT" --quiet enable systemd-networkd.service systemd-resolved.service \
    systemd-timesyncd.service appliance-growroot.service appliance-ssh.service
  # ssh is off unless provisioning turns it on; every device makes its own host keys (10-hostkeys.conf).
  systemctl --root="$ROOT" --quiet disable ssh.service ssh.socket 2>/dev/null || true
  rm -f "$ROOT"/etc/ssh/ssh_host_*
  # /tmp in RAM: fewer writes to the card.
  if [ -f "$ROOT/usr/share/systemd/tmp.mount" ]; then
    cp "$ROOT/usr/share/systemd/tmp.mount" "$ROOT/etc/systemd/system/tmp.mount"
    systemctl --root="$ROOT" --quiet enable tmp.mount
  fi
  # No swap anywhere: fstab has none, and no swap unit may be pulled in.
  ln -sf /dev/null "$ROOT/etc/systemd/system/swap.target"
  # The data directory /var/lib/appliance is the broker unit's StateDirectory (made 0700 for its user at start), on
  # the root filesystem that first boot grows to the whole card.
  # First boot: a fresh machine-id per device (systemd makes one when the file is empty).
  : >"$ROOT/etc/machine-id"
}

# base_filesystems DIR: DIR/boot.vfat from /boot/firmware and DIR/root.ext4 from the rest of the base tree, both
# with the fixed ROOTFS_EPOCH times (nothing mounted); DIR/sizes records the root file system's size.
base_filesystems() {
  local dir=$1 boot_dir=$WORK/bootfs used_mib root_mib
  # The boot partition's content is what raspi-firmware put in /boot/firmware; the root keeps the empty mount point.
  rm -rf "$boot_dir"
  mv "$ROOT/boot/firmware" "$boot_dir"
  mkdir -m 0755 "$ROOT/boot/firmware"
  touch --date="@$ROOTFS_EPOCH" "$ROOT/boot/firmware" "$ROOT/boot"

  log "boot: FAT32 $BOOT_MIB MiB, label $BOOT_LABEL, $(find "$boot_dir" -type f | wc -l) files"
  mkfs.vfat -F 32 -n "$BOOT_LABEL" -i "$BOOT_VOLID" --invariant -h $((PART_OFFSET_MIB * 2048)) \
    -C "$dir/boot.vfat" $((BOOT_MIB * 1024)) >/dev/null
  local -a top=()
  mapfile -d '' -t top < <(find "$boot_dir" -mindepth 1 -maxdepth 1 -print0 | LC_ALL=C sort -z)
  MTOOLS_SKIP_CHECK=1 mcopy -i "$dir/boot.vfat" -s -p -m -Q "${top[@]}" ::/
  fsck.vfat -n "$dir/boot.vfat" >/dev/null || die "fsck.vfat reports errors on the new boot filesystem"

  # Root: content + 15% for ext4 metadata + ROOT_FREE_MIB (room for the appliance and the first boot), rounded up to
  # 4 MiB. Grown to the card on first boot.
  used_mib=$(du -s --block-size=1M "$ROOT" | cut -f1)
  root_mib=$(((used_mib * 115 / 100 + ROOT_FREE_MIB + 3) / 4 * 4))
  log "root: ext4 $root_mib MiB for $used_mib MiB of files, label $ROOT_LABEL"
  E2FSPROGS_FAKE_TIME=$ROOTFS_EPOCH mkfs.ext4 -q -F -b 4096 -L "$ROOT_LABEL" -U "$ROOT_UUID" \
    -E "hash_seed=$ROOT_UUID,root_owner=0:0" -d "$ROOT" "$dir/root.ext4" "${root_mib}M" >/dev/null
  pin_inode_times "$dir/root.ext4" "$ROOTFS_EPOCH"
  e2fsck -fn "$dir/root.ext4" >/dev/null 2>&1 || die "e2fsck reports errors on the base root filesystem"
  printf 'used_mib=%s\nroot_mib=%s\n' "$used_mib" "$root_mib" >"$dir/sizes"
}

# pin_inode_times EXT4 EPOCH: mke2fs 1.47.0 -d copies each source file's ctime and atime (the time of this build's
# unpack); set both to EPOCH with debugfs so the file system bytes do not depend on when the build ran.
pin_inode_times() {
  local cmds=$WORK/debugfs-times.cmds
  (cd "$ROOT" && find . -printf '%P\n') | awk -v t="@$2" '
    /["\\]/ { next }  # no such names in the tree; debugfs could not quote them
    { p = "/" $0; printf "sif \"%s\" ctime %s\nsif \"%s\" atime %s\n", p, t, p, t }' >"$cmds"
  run_debugfs "$1" "$cmds" "$2"
}

# run_debugfs EXT4 CMDS EPOCH: apply a debugfs command file (times pinned to EPOCH); any error message fails.
run_debugfs() {
  E2FSPROGS_FAKE_TIME=$3 debugfs -w -f "$2" "$1" >/dev/null 2>"$WORK/debugfs.err"
  if grep -v '^debugfs [0-9.]* ' "$WORK/debugfs.err" | grep -q .; then
    die "debugfs on $(basename "$1"): $(grep -v '^debugfs [0-9.]* ' "$WORK/debugfs.err" | head -n3)"
  fi
}
