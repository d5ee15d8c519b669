# shellcheck shell=bash
# Stage disk: the cached FAT32 boot and ext4 root file systems (stage base) with the appliance added to the root by
# debugfs, MBR via sfdisk, xz in cached blocks.

IMAGE_NAME=appliance-arm64

stage_disk() {
  stage_begin disk
  local img=$OUT/$IMAGE_NAME.img used_mib root_mib total_mib boot_start root_start root_part
  # shellcheck source=/dev/null
  . "$BASE/sizes"

  # MBR: partition 1 FAT32 (LBA, type c) from PART_OFFSET_MIB, partition 2 Linux right after it.
  boot_start=$((PART_OFFSET_MIB * 2048))
  root_start=$(((PART_OFFSET_MIB + BOOT_MIB) * 2048))
  total_mib=$((PART_OFFSET_MIB + BOOT_MIB + root_mib))
  rm -f "$img"
  truncate -s "${total_mib}M" "$img"
  sfdisk --quiet "$img" <<EOF
label: dos
label-id: $DISK_ID
unit: sectors

start=$boot_start, size=$((BOOT_MIB * 2048)), type=c
start=$root_start, size=$((root_mib * 2048)), type=83
EOF
  dd if="$BASE/boot.vfat" of="$img" bs=1M seek="$PART_OFFSET_MIB" conv=notrunc,sparse status=none
  dd if="$BASE/root.ext4" of="$img" bs=1M seek=$((PART_OFFSET_MIB + BOOT_MIB)) conv=notrunc,sparse status=none
  # Root: the base file system plus the files stage configure added, written by debugfs into the partition in place
  # (e2fsprogs' "file?offset=" names it; nothing mounted).
  root_part="$img?offset=$((root_start * 512))"
  run_debugfs "$root_part" "$WORK/delta.cmds" "$SOURCE_DATE_EPOCH"
  e2fsck -fn "$root_part" >/dev/null 2>&1 || die "e2fsck reports errors on the new root filesystem"
  touch --date="@$SOURCE_DATE_EPOCH" "$img"

  rm -f "$img.sha256" "$img.xz" "$img.xz.sha256"
  if [ "$COMPRESS" = 1 ]; then
    # One .xz stream of 16 MiB blocks compressed on all cores; a block whose input has not changed since an earlier
    # build comes from CACHE/xz (after an appliance change, most of the image).
    log "compressing $total_mib MiB with xz -$XZ_LEVEL"
    python3 "$IMAGE_DIR/xzchunks.py" "$img" "$img.xz" --cache "$CACHE/xz" --level "$XZ_LEVEL" \
      --image-sha256 "$img.sha256" 2>&1 | sed -u 's/^/    /' >&2
    [ -f "$img.xz" ] || die "xz compression failed"
    touch --date="@$SOURCE_DATE_EPOCH" "$img.xz"
    (cd "$OUT" && sha256sum "$IMAGE_NAME.img.xz" >"$IMAGE_NAME.img.xz.sha256")
  else
    sha256sum "$img" | sed "s:  .*:  $IMAGE_NAME.img:" >"$img.sha256"
  fi
  write_build_info "$used_mib" "$root_mib" "$total_mib"
  if [ -f "$img.xz" ]; then
    stage_end "$total_mib MiB raw, $(du -m "$img.xz" | cut -f1) MiB xz"
  else
    stage_end "$total_mib MiB raw, not compressed"
  fi
}

# write_build_info USED_MIB ROOT_MIB TOTAL_MIB: build-info.json, the figures a test or bench/RESULTS.md reads.
write_build_info() {
  python3 - "$OUT/build-info.json" "$@" <<PY
import json, os, sys
out = os.environ["OUT"]
xz = os.path.join(out, "$IMAGE_NAME.img.xz")
info = {
    "image": "$IMAGE_NAME.img",
    "source_date_epoch": int(os.environ["SOURCE_DATE_EPOCH"]),
    "root_tree_sha256": open(os.path.join(out, "root-tree.sha256")).read().split()[0],
    "image_sha256": open(os.path.join(out, "$IMAGE_NAME.img.sha256")).read().split()[0],
    "rootfs_cache": os.path.basename("$ROOTFS_TAR"),
    "base_cache": os.path.basename("$BASE"),
    "wheelhouse_cache": os.path.basename("$WHEELHOUSE"),
    "root_used_mib": int(sys.argv[2]),
    "root_partition_mib": int(sys.argv[3]),
    "raw_mib": int(sys.argv[4]),
    "xz_bytes": os.path.getsize(xz) if os.path.exists(xz) else None,
    "xz_level": int(os.environ.get("XZ_LEVEL", "3")),
    "boot_label": "$BOOT_LABEL",
    "root_label": "$ROOT_LABEL",
    "root_uuid": "$ROOT_UUID",
}
json.dump(info, open(sys.argv[1], "w"), indent=2, sort_keys=True)
PY
}
