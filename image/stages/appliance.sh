# shellcheck shell=bash
# Stage appliance: the appliance wheel built from this checkout (always rebuilt: it is the part that changes), with a
# pinned setuptools from a cached build venv, from a clean copy of the package sources (no stale build/ or egg-info).

# The build backend (pyproject.toml requires setuptools>=68; since 70.1 it makes wheels without the wheel package).
WHEEL_BUILD_REQUIREMENT="setuptools==80.9.0"
# No setup.py: the wheel is pure Python (py3-none-any). setup.py only adds the optional C recorder of the delivery
# log, which would be built for this host's architecture, not the image's arm64; the image runs its Python fallback.
WHEEL_SOURCES=(pyproject.toml README.md "LICEN[CS]E*" appliance cloud_spark provisioning)

stage_appliance() {
  stage_begin appliance
  local venv dir src
  venv=$CACHE/wheel-build-$(hash_inputs "s:$WHEEL_BUILD_REQUIREMENT" "s:$HOST_PYTHON")
  if [ ! -f "$venv/.complete" ]; then
    log "build venv $(basename "$venv") ($WHEEL_BUILD_REQUIREMENT)"
    rm -rf "$venv"
    "$HOST_PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$WHEEL_BUILD_REQUIREMENT" >&2 ||
      die "cannot install $WHEEL_BUILD_REQUIREMENT into the wheel build venv"
    touch "$venv/.complete"
    find "$CACHE" -maxdepth 1 -name 'wheel-build-*' ! -name "$(basename "$venv")" -exec rm -rf {} +
  fi
  dir=$OUT/wheel
  src=$OUT/wheel-src
  rm -rf "$dir" "$src"
  mkdir -p "$dir" "$src"
  # Tracked and new (not ignored) files of the package: what the checkout holds now, edits included.
  if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard -- "${WHEEL_SOURCES[@]}" |
      xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh | tar --null -T - -cf -) |
      tar -C "$src" -xf -
  else
    # shellcheck disable=SC2068 # the LICENSE pattern is meant to glob
    (cd "$REPO" && for f in ${WHEEL_SOURCES[@]}; do [ ! -e "$f" ] || cp -r "$f" "$src/"; done)
  fi
  if ! (cd "$src" && "$venv/bin/python" -c 'import sys
from setuptools import build_meta
print(build_meta.build_wheel(sys.argv[1]))' "$dir") >"$OUT/wheel.log" 2>&1; then
    cat "$OUT/wheel.log" >&2
    die "building the appliance wheel failed"
  fi
  rm -rf "$src"
  APPLIANCE_WHEEL=$(find "$dir" -name 'appliance-*.whl' | head -n1)
  [ -n "$APPLIANCE_WHEEL" ] || die "the build produced no appliance wheel"
  stage_end "$(basename "$APPLIANCE_WHEEL")"
}
