# shellcheck shell=bash
# Stage rootfs: Debian bookworm arm64 from packages.txt via mmdebstrap under qemu-user, cached as a tarball.

stage_rootfs() {
  stage_begin rootfs
  ensure_binfmt
  local mirror security key tar packages
  mirror=$(debian_mirror)
  security=$(debian_security_mirror)
  packages=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$IMAGE_DIR/packages.txt" | tr -s ' \n' ',' | sed 's/,$//')
  key=$(hash_inputs "$IMAGE_DIR/packages.txt" "$IMAGE_DIR/config.sh" "$IMAGE_DIR/stages/rootfs.sh" "$IMAGE_DIR/hooks" \
    "s:$mirror" "s:$security")
  tar=$CACHE/rootfs-$key.tar
  ROOTFS_TAR=$tar
  if [ -f "$tar" ] && [ "$REBUILD_ROOTFS" = 0 ]; then
    stage_end "cached $(basename "$tar")"
    return
  fi
  log "mmdebstrap $SUITE $ARCH ($(echo "$packages" | tr ',' '\n' | wc -l) packages) -> $(basename "$tar"); takes minutes"
  local -a sources=("deb $mirror $SUITE $COMPONENTS" "deb $mirror $SUITE-updates $COMPONENTS")
  [ -z "$security" ] || sources+=("deb $security $SUITE-security $COMPONENTS")
  # Docs, man pages and translations are dead weight on a card; copyright files stay.
  SOURCE_DATE_EPOCH=$ROOTFS_EPOCH mmdebstrap \
    --mode=root --format=tar --architectures="$ARCH" --variant=apt --components="${COMPONENTS// /,}" \
    --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --aptopt='Acquire::Retries "3"' \
    --essential-hook="$IMAGE_DIR/hooks/essential-defer-initramfs.sh" \
    --customize-hook="$IMAGE_DIR/hooks/customize-rootfs.sh" \
    "$SUITE" "$tar.part" "${sources[@]}" 2>&1 | sed -u 's/^/    /' >&2
  mv "$tar.part" "$tar"
  # Older rootfs tarballs are dead cache entries.
  find "$CACHE" -maxdepth 1 -name 'rootfs-*.tar' ! -name "$(basename "$tar")" -delete
  stage_end "built $(basename "$tar"), $(du -m "$tar" | cut -f1) MiB"
}
