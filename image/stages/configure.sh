# shellcheck shell=bash
# Stage configure: unpack the cached rootfs, install the appliance with scripts/install-appliance.sh in a qemu-user
# chroot, apply the SD-card settings, clamp mtimes, record the root tree hash and the package manifests.

stage_configure() {
  stage_begin configure
  local bundle=/tmp/appliance-install
  rm -rf "$WORK"
  mkdir -p "$ROOT"
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

  write_manifests
  clamp_mtimes "$ROOT" "$SOURCE_DATE_EPOCH"
  tree_hash "$ROOT" "$OUT/root-tree.list" >"$OUT/root-tree.sha256"
  stage_end "root tree $(cut -c1-16 "$OUT/root-tree.sha256")"
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

# write_manifests: Debian packages (dpkg-query on the rootfs's database) and the wheels in the appliance venv.
write_manifests() {
  dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f='${binary:Package}\t${Version}\t${Architecture}\n' |
    LC_ALL=C sort >"$OUT/packages.tsv"
  find "$ROOT$APPLIANCE_PREFIX" -path '*/site-packages/*.dist-info' -maxdepth 6 -type d -printf '%f\n' |
    sed -E 's/\.dist-info$//; s/-([^-]+)$/\t\1/' | LC_ALL=C sort >"$OUT/python-packages.tsv"
}
