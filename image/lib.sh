# shellcheck shell=bash
# Shared helpers for image/build.sh and its stages: progress, timing, cache keys, mirror lookup, chroot runs.

BUILD_T0=${BUILD_T0:-$(date +%s.%N)}

# log MSG: one progress line with the elapsed build time.
log() {
  local now
  now=$(date +%s.%N)
  printf '[image %6.1fs] %s\n' "$(awk -v a="$now" -v b="$BUILD_T0" 'BEGIN { print a - b }')" "$*" >&2
}

die() { log "ERROR: $*"; exit 1; }

# stage_begin NAME / stage_end [NOTE]: stage banners with per-stage elapsed time; stage_end appends name, seconds,
# note and the 1-minute load average to $OUT/timings.tsv.
stage_begin() {
  STAGE_NAME=$1
  STAGE_T0=$(date +%s.%N)
  log "==> stage $STAGE_NAME"
}
stage_end() {
  local secs
  secs=$(awk -v a="$(date +%s.%N)" -v b="$STAGE_T0" 'BEGIN { print a - b }')
  log "<== stage $STAGE_NAME done in $(printf '%.1f' "$secs")s${1:+ ($1)}"
  printf '%s\t%.1f\t%s\t%s\n' "$STAGE_NAME" "$secs" "${1:-}" "$(cut -d' ' -f1 /proc/loadavg)" >>"$OUT/timings.tsv"
}

# hash_inputs ARG...: a short sha256 over files (by content) and literal strings (prefixed 's:'), in order.
hash_inputs() {
  local a
  for a in "$@"; do
    if [[ $a == s:* ]]; then
      printf 'str %s\n' "${a#s:}"
    elif [ -d "$a" ]; then
      (cd "$a" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
    else
      printf 'file %s %s\n' "$(basename "$a")" "$(sha256sum <"$a" | cut -c1-64)"
    fi
  done | sha256sum | cut -c1-16
}

# debian_mirror: the Debian archive URI this machine's apt uses (read at run time, never stored in the repo).
debian_mirror() {
  local uri=""
  if compgen -G '/etc/apt/sources.list.d/*.sources' >/dev/null; then
    uri=$(awk '
      /^[[:space:]]*$/ { if (deb && main && u != "") { print u; exit } deb = 0; main = 0; u = ""; next }
      /^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      /^URIs:/ { u = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i !~ /-security$/ && $i !~ /-updates$/ && $i !~ /-backports$/) main = 1 }
      END { if (deb && main && u != "") print u }
    ' /etc/apt/sources.list.d/*.sources | head -n1)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $3 !~ /-(security|updates|backports)$/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
      /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || die "no Debian mirror found in /etc/apt/sources.list*"
  printf '%s\n' "${uri%/}"
}

# debian_security_mirror: the security archive URI from apt's sources, or empty.
debian_security_mirror() {
  cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
    /^[[:space:]]*$/ { if (sec && u != "") { print u; exit } sec = 0; u = ""; next }
    /^URIs:/ { u = $2 }
    /^Suites:/ { for (i = 2; i <= NF; i++) if ($i ~ /-security$/) sec = 1 }
    END { if (sec && u != "") print u }
  ' | head -n1 | sed 's:/*$::'
}

# ensure_binfmt: arm64 binaries must run through qemu-user-static (mmdebstrap and chroot need it).
ensure_binfmt() {
  if ! update-binfmts --display qemu-aarch64 2>/dev/null | grep -q '(enabled)'; then
    log "enabling binfmt for qemu-aarch64"
    update-binfmts --enable qemu-aarch64 || die "cannot enable binfmt qemu-aarch64 (install qemu-user-static binfmt-support)"
  fi
}

# in_chroot ROOT CMD...: run CMD inside ROOT with /proc, /sys, /dev in a private mount namespace (unmounted on exit).
in_chroot() {
  local root=$1
  shift
  unshare --mount --propagation private -- /bin/sh -ec '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/run"
    exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 HOME=/root DEBIAN_FRONTEND=noninteractive SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" "$@"
  ' in_chroot "$root" "$@"
}

# clamp_mtimes DIR EPOCH: no file in DIR is newer than EPOCH (reproducible trees and filesystems).
clamp_mtimes() {
  find "$1" -xdev -newermt "@$2" -print0 | xargs -0 -r touch --no-dereference --date="@$2"
}

# tree_hash DIR [LISTFILE]: sha256 over every entry's path, type, mode, owner, mtime and content (image/treehash.py).
tree_hash() {
  python3 "$IMAGE_DIR/treehash.py" "$@"
}
