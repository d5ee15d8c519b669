#!/usr/bin/env bash
# Build the flashable arm64 SD-card image: rootfs -> wheels -> appliance -> base -> configure -> disk (image/README.md).
set -euo pipefail

IMAGE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$IMAGE_DIR/.." && pwd)
export BUILD_T0=${BUILD_T0:-$(date +%s.%N)}
# shellcheck source=image/lib.sh
. "$IMAGE_DIR/lib.sh"
# shellcheck source=image/config.sh
. "$IMAGE_DIR/config.sh"

usage() {
  cat <<'EOF'
usage: image/build.sh [--out DIR] [--cache DIR] [--no-compress] [--rebuild-rootfs] [--keep-work]

  --out DIR         outputs (default image/out): appliance-arm64.img[.xz], .sha256, packages.tsv, ...
  --cache DIR       stage cache (default image/cache): rootfs, wheelhouse, base tree and file systems, xz blocks
  --no-compress     stop at the raw .img (tests and quick iterations); no .img.xz / .sha256
  --rebuild-rootfs  ignore a cached rootfs for the current inputs and build it again
  --keep-work       keep DIR/work (the root tree and partition files) after the build

environment: SOURCE_DATE_EPOCH (default: commit time of HEAD), XZ_LEVEL (default 1), PYTHON_WHEEL_PIP,
             HOST_PYTHON (default /usr/bin/python3: byte-compiles the appliance if it compiles like the image's)
EOF
}

OUT=$IMAGE_DIR/out
CACHE=$IMAGE_DIR/cache
COMPRESS=1
REBUILD_ROOTFS=0
KEEP_WORK=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --no-compress) COMPRESS=0; shift ;;
    --rebuild-rootfs) REBUILD_ROOTFS=1; shift ;;
    --keep-work) KEEP_WORK=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done

[ "$(id -u)" = 0 ] || die "must run as root (mmdebstrap, chroot, file ownership in the root tree)"
for tool in mmdebstrap aarch64-linux-gnu-gcc sfdisk mkfs.vfat mcopy mkfs.ext4 e2fsck debugfs fsck.vfat unshare dpkg-query python3; do
  command -v "$tool" >/dev/null || die "missing $tool: run scripts/setup.sh"
done
mkdir -p "$OUT" "$CACHE"
OUT=$(cd "$OUT" && pwd)
CACHE=$(cd "$CACHE" && pwd)
export IMAGE_DIR REPO OUT CACHE
HOST_PYTHON=${HOST_PYTHON:-/usr/bin/python3}
export XZ_LEVEL=${XZ_LEVEL:-1}
[ -x "$HOST_PYTHON" ] || die "HOST_PYTHON $HOST_PYTHON is not an executable python"

# One build at a time per cache (the test suite and a developer may both start one).
exec 9>"$CACHE/.lock"
flock 9

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo "$ROOTFS_EPOCH")
fi
export SOURCE_DATE_EPOCH
[ "$SOURCE_DATE_EPOCH" -ge "$ROOTFS_EPOCH" ] || die "SOURCE_DATE_EPOCH must not be older than ROOTFS_EPOCH"
export TZ=UTC LC_ALL=C.UTF-8

WORK=$OUT/work
ROOT=$WORK/root
: >"$OUT/timings.tsv"
log "image build: out=$OUT cache=$CACHE SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"

for stage in rootfs wheels appliance recorder base configure disk; do
  # shellcheck source=/dev/null
  . "$IMAGE_DIR/stages/$stage.sh"
done

stage_rootfs
stage_wheels
stage_appliance
stage_recorder
stage_base
stage_configure
stage_disk

[ "$KEEP_WORK" = 1 ] || rm -rf "$WORK"
log "done: $(cd "$OUT" && ls -1 appliance-arm64.* | tr '\n' ' ')"
log "stage times (s): $(awk -F'\t' '{ printf "%s=%s ", $1, $2 }' "$OUT/timings.tsv")"
