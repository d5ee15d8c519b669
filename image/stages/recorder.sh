# shellcheck shell=bash
# Stage recorder: the delivery log's C recorder (appliance/deliverylog/_recorder.c) cross-compiled on the host for the
# image's python3.11 on arm64, against bookworm's own arm64 CPython headers (libpython3.11-dev, extracted into the
# stage cache, never installed in the image). Configure installs it next to the appliance's Python files.

RECORDER_CC=${RECORDER_CC:-aarch64-linux-gnu-gcc}
RECORDER_SO=_recorder.cpython-311-aarch64-linux-gnu.so  # the image's python3.11 EXT_SUFFIX
PYTHON_HEADERS_PACKAGE=libpython3.11-dev

stage_recorder() {
  stage_begin recorder
  command -v "$RECORDER_CC" >/dev/null || die "missing $RECORDER_CC: run scripts/setup.sh (gcc-aarch64-linux-gnu)"
  local mirror key headers
  mirror=$(debian_mirror)
  key=$(hash_inputs "$IMAGE_DIR/config.sh" "$IMAGE_DIR/stages/recorder.sh" "s:$mirror")
  headers=$CACHE/pyheaders-$key
  if [ ! -f "$headers/.complete" ]; then
    log "mmdebstrap --variant=extract $PYTHON_HEADERS_PACKAGE ($ARCH) -> $(basename "$headers")"
    rm -rf "$headers"
    mmdebstrap --mode=root --variant=extract --architectures="$ARCH" --include="$PYTHON_HEADERS_PACKAGE" \
      --aptopt='Acquire::Retries "3"' "$SUITE" "$headers" "deb $mirror $SUITE main" 2>&1 | sed -u 's/^/    /' >&2
    [ -f "$headers/usr/include/python3.11/Python.h" ] || die "$PYTHON_HEADERS_PACKAGE gave no Python.h"
    touch "$headers/.complete"
    find "$CACHE" -maxdepth 1 -name 'pyheaders-*' ! -name "$(basename "$headers")" -exec rm -rf {} +
  fi
  mkdir -p "$OUT/recorder"
  RECORDER_PATH=$OUT/recorder/$RECORDER_SO
  # No -g: no build paths in the file, so two builds give the same bytes. The extracted /usr/include comes after the
  # cross compiler's own (its pyconfig.h names <aarch64-linux-gnu/python3.11/pyconfig.h>; libc stays the toolchain's).
  "$RECORDER_CC" -shared -fPIC -O2 -fwrapv -fno-strict-aliasing -Wall -Wextra -Wno-missing-field-initializers \
    -Werror -I "$headers/usr/include/python3.11" -idirafter "$headers/usr/include" \
    "$REPO/appliance/deliverylog/_recorder.c" -o "$RECORDER_PATH" || die "cross-compiling the recorder failed"
  stage_end "$RECORDER_SO, $(stat -c %s "$RECORDER_PATH") bytes"
}
