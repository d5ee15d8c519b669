# shellcheck shell=bash
# Stage configure: the cached base tree plus this checkout's appliance wheel, installed from the host
# (image/install_wheel.py: files, entry-point scripts, RECORD, checked-hash byte code); mtimes clamped, the root tree
# hash, the package manifests, and the debugfs commands that add the same files to the base root file system.

stage_configure() {
  stage_begin configure
  local host_version
  rm -rf "$WORK"
  mkdir -p "$ROOT"
  tar -xpf "$BASE/root.tar" -C "$ROOT" --numeric-owner --xattrs --xattrs-include='*'

  host_version=$("$HOST_PYTHON" -c 'import sys; print(sys.version)')
  if [ -f "$BASE/host-python" ] && [ "$(cat "$BASE/host-python")" = "$host_version" ]; then
    "$HOST_PYTHON" "$IMAGE_DIR/install_wheel.py" install --root "$ROOT" --prefix "$APPLIANCE_PREFIX" \
      --wheel "$APPLIANCE_WHEEL" >"$WORK/appliance-sources" || die "installing $(basename "$APPLIANCE_WHEEL") failed"
  else
    # The host's python does not compile like the image's: byte-compile in the chroot (slower, qemu-user).
    log "byte-compiling the appliance with the image's python under qemu-user (host python differs)"
    "$HOST_PYTHON" "$IMAGE_DIR/install_wheel.py" install --no-compile --root "$ROOT" --prefix "$APPLIANCE_PREFIX" \
      --wheel "$APPLIANCE_WHEEL" >"$WORK/appliance-sources" || die "installing $(basename "$APPLIANCE_WHEEL") failed"
    sed 's:^:/:' "$WORK/appliance-sources" | tr '\n' '\0' |
      in_chroot "$ROOT" xargs -0 "$APPLIANCE_PREFIX/bin/python" -m py_compile ||
      die "byte-compiling the appliance in the chroot failed"
  fi

  write_manifests
  clamp_mtimes "$ROOT" "$SOURCE_DATE_EPOCH"
  tree_hash "$ROOT" "$OUT/root-tree.list" >"$OUT/root-tree.sha256"
  python3 "$IMAGE_DIR/ext4delta.py" "$BASE/root.list" "$OUT/root-tree.list" "$ROOT" "$SOURCE_DATE_EPOCH" \
    >"$WORK/delta.cmds" || die "the root tree is not the base plus added files"
  stage_end "root tree $(cut -c1-16 "$OUT/root-tree.sha256"), $(grep -c '^write ' "$WORK/delta.cmds") files added"
}

# write_manifests: Debian packages (dpkg-query on the rootfs's database) and the wheels in the appliance venv.
write_manifests() {
  dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f='${binary:Package}\t${Version}\t${Architecture}\n' |
    LC_ALL=C sort >"$OUT/packages.tsv"
  find "$ROOT$APPLIANCE_PREFIX" -path '*/site-packages/*.dist-info' -maxdepth 6 -type d -printf '%f\n' |
    sed -E 's/\.dist-info$//; s/-([^-]+)$/\t\1/' | LC_ALL=C sort >"$OUT/python-packages.tsv"
}
