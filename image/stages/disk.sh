# shellcheck shell=bash
# Stage disk: FAT32 boot + ext4 root built as files (mtools, mkfs.ext4 -d; nothing mounted), MBR via sfdisk, xz.

IMAGE_NAME=appliance-arm64

stage_disk() {
  stage_begin disk
  local boot_dir=$WORK/bootfs boot_img=$WORK/boot.vfat root_img=$WORK/root.ext4 img=$OUT/$IMAGE_NAME.img
  local used_mib root_mib total_mib boot_start root_start

  # The boot partition's content is what raspi-firmware put in /boot/firmware; the root keeps the empty mount point.
  rm -rf "$boot_dir"
  mv "$ROOT/boot/firmware" "$boot_dir"
  mkdir -m 0755 "$ROOT/boot/firmware"
  touch --date="@$SOURCE_DATE_EPOCH" "$ROOT/boot/firmware" "$ROOT/boot"

  log "boot: FAT32 $BOOT_MIB MiB, label $BOOT_LABEL, $(find "$boot_dir" -type f | wc -l) files"
  rm -f "$boot_img"
  mkfs.vfat -F 32 -n "$BOOT_LABEL" -i "$BOOT_VOLID" --invariant -h $((PART_OFFSET_MIB * 2048)) \
    -C "$boot_img" $((BOOT_MIB * 1024)) >/dev/null
  local -a top=()
  mapfile -d '' -t top < <(find "$boot_dir" -mindepth 1 -maxdepth 1 -print0 | LC_ALL=C sort -z)
  MTOOLS_SKIP_CHECK=1 mcopy -i "$boot_img" -s -p -m -Q "${top[@]}" ::/
  fsck.vfat -n "$boot_img" >/dev/null || die "fsck.vfat reports errors on the new boot filesystem"

  # Root: content + 15% for ext4 metadata + ROOT_FREE_MIB, rounded up to 4 MiB. Grown to the card on first boot.
  used_mib=$(du -s --block-size=1M "$ROOT" | cut -f1)
  root_mib=$(((used_mib * 115 / 100 + ROOT_FREE_MIB + 3) / 4 * 4))
  log "root: ext4 $root_mib MiB for $used_mib MiB of files, label $ROOT_LABEL"
  rm -f "$root_img"
  E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH mkfs.ext4 -q -F -b 4096 -L "$ROOT_LABEL" -U "$ROOT_UUID" \
    -E "hash_seed=$ROOT_UUID,root_owner=0:0" -d "$ROOT" "$root_img" "${root_mib}M" >/dev/null
  pin_inode_times "$root_img"
  e2fsck -fn "$root_img" >/dev/null 2>&1 || die "e2fsck reports errors on the new root filesystem"

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
  dd if="$boot_img" of="$img" bs=1M seek="$PART_OFFSET_MIB" conv=notrunc,sparse status=none
  dd if="$root_img" of="$img" bs=1M seek=$((PART_OFFSET_MIB + BOOT_MIB)) conv=notrunc,sparse status=none
  touch --date="@$SOURCE_DATE_EPOCH" "$img"
  sha256sum "$img" | sed "s:  .*:  $IMAGE_NAME.img:" >"$img.sha256"

  rm -f "$img.xz" "$img.xz.sha256"
  if [ "$COMPRESS" = 1 ]; then
    log "compressing $total_mib MiB with xz -${XZ_LEVEL:-3} (the slow part of a cached rebuild)"
    xz -T2 "-${XZ_LEVEL:-3}" --block-size=64MiB -k -c "$img" >"$img.xz.part"
    mv "$img.xz.part" "$img.xz"
    touch --date="@$SOURCE_DATE_EPOCH" "$img.xz"
    (cd "$OUT" && sha256sum "$IMAGE_NAME.img.xz" >"$IMAGE_NAME.img.xz.sha256")
  fi
  write_build_info "$used_mib" "$root_mib" "$total_mib"
  if [ -f "$img.xz" ]; then
    stage_end "$total_mib MiB raw, $(du -m "$img.xz" | cut -f1) MiB xz"
  else
    stage_end "$total_mib MiB raw, not compressed"
  fi
}

# pin_inode_times EXT4: mke2fs 1.47.0 -d copies each source file's ctime and atime (the time of this build's unpack);
# set both to SOURCE_DATE_EPOCH with debugfs so the file system bytes do not depend on when the build ran.
pin_inode_times() {
  local cmds=$WORK/debugfs-times.cmds
  (cd "$ROOT" && find . -printf '%P\n') | awk -v t="@$SOURCE_DATE_EPOCH" '
    /["\\]/ { next }  # no such names in the tree; debugfs could not quote them
    { p = "/" $0; printf "sif \"%s\" ctime %s\nsif \"%s\" atime %s\n", p, t, p, t }' >"$cmds"
  E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH debugfs -w -f "$cmds" "$1" >/dev/null 2>"$WORK/debugfs-times.err"
  if grep -v '^debugfs [0-9.]* ' "$WORK/debugfs-times.err" | grep -q .; then
    die "debugfs could not pin inode times: $(head -n3 "$WORK/debugfs-times.err")"
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
    "wheelhouse_cache": os.path.basename("$WHEELHOUSE"),
    "root_used_mib": int(sys.argv[2]),
    "root_partition_mib": int(sys.argv[3]),
    "raw_mib": int(sys.argv[4]),
    "xz_bytes": os.path.getsize(xz) if os.path.exists(xz) else None,
    "boot_label": "$BOOT_LABEL",
    "root_label": "$ROOT_LABEL",
    "root_uuid": "$ROOT_UUID",
}
json.dump(info, open(sys.argv[1], "w"), indent=2, sort_keys=True)
PY
}
