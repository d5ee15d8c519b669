# shellcheck shell=bash
# Stage configure: this checkout's appliance wheel installed from the host (image/install_wheel.py: files, entry-point
# scripts, RECORD, checked-hash byte code) into a staging tree that holds only the venv's directories; mtimes clamped;
# the root tree list = the cached base's list plus the staged entries (treehash.py --over), its hash, the manifests,
# and the debugfs commands that add the staged files to the base root file system (ext4delta.py).

stage_configure() {
  stage_begin configure
  local stage=$WORK/stage host_version site
  rm -rf "$WORK"
  mkdir -p "$stage"
  host_version=$("$HOST_PYTHON" -c 'import sys; print(sys.version)')
  if [ -f "$BASE/host-python" ] && [ "$(cat "$BASE/host-python")" = "$host_version" ]; then
    # The venv's directories as the base has them (modes, owners), empty: the wheel's files go in there.
    site=$(awk -F'\t' -v p="${APPLIANCE_PREFIX#/}/lib/" 'index($1, p) == 1 && $1 ~ /\/site-packages$/ { print $1 }' \
      "$BASE/root.list")
    [ -n "$site" ] || die "no site-packages under $APPLIANCE_PREFIX in the base"
    mkdir -p "$stage/$site" "$stage$APPLIANCE_PREFIX/bin"
    "$HOST_PYTHON" "$IMAGE_DIR/install_wheel.py" install --root "$stage" --prefix "$APPLIANCE_PREFIX" \
      --wheel "$APPLIANCE_WHEEL" --add "$RECORDER_PATH" "appliance/deliverylog/$RECORDER_SO" >/dev/null ||
      die "installing $(basename "$APPLIANCE_WHEEL") failed"
  else
    # The host's python does not compile like the image's: install into the whole base tree and byte-compile in
    # the arm64 chroot (slower: the tree is unpacked and python runs under qemu-user).
    log "byte-compiling the appliance with the image's python under qemu-user (host python differs)"
    tar -xpf "$BASE/root.tar" -C "$stage" --numeric-owner --xattrs --xattrs-include='*'
    "$HOST_PYTHON" "$IMAGE_DIR/install_wheel.py" install --no-compile --root "$stage" --prefix "$APPLIANCE_PREFIX" \
      --wheel "$APPLIANCE_WHEEL" --add "$RECORDER_PATH" "appliance/deliverylog/$RECORDER_SO" \
      >"$WORK/appliance-sources" || die "installing $(basename "$APPLIANCE_WHEEL") failed"
    sed 's:^:/:' "$WORK/appliance-sources" | tr '\n' '\0' |
      in_chroot "$stage" xargs -0 "$APPLIANCE_PREFIX/bin/python" -m py_compile ||
      die "byte-compiling the appliance in the chroot failed"
  fi
  clamp_mtimes "$stage" "$SOURCE_DATE_EPOCH"
  python3 "$IMAGE_DIR/treehash.py" --over "$BASE/root.list" "$stage" "$OUT/root-tree.list" >"$OUT/root-tree.sha256" ||
    die "the staged appliance collides with the base tree"
  write_manifests
  python3 "$IMAGE_DIR/ext4delta.py" "$BASE/root.list" "$OUT/root-tree.list" "$stage" "$SOURCE_DATE_EPOCH" \
    >"$WORK/delta.cmds" || die "the root tree is not the base plus added files"
  stage_end "root tree $(cut -c1-16 "$OUT/root-tree.sha256"), $(grep -c '^write ' "$WORK/delta.cmds") files added"
}

# write_manifests: the Debian packages (from the base's dpkg database) and the distributions in the appliance venv.
write_manifests() {
  cp "$BASE/packages.tsv" "$OUT/packages.tsv"
  awk -F'\t' -v p="${APPLIANCE_PREFIX#/}/lib/" 'index($1, p) == 1 && $1 ~ /\/site-packages\/[^\/]+\.dist-info$/ {
      n = split($1, part, "/"); print part[n] }' "$OUT/root-tree.list" |
    sed -E 's/\.dist-info$//; s/-([^-]+)$/\t\1/' | LC_ALL=C sort >"$OUT/python-packages.tsv"
}
