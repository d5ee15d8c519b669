# shellcheck shell=bash
# Stage appliance: the appliance wheel built from this checkout (always rebuilt: it is the part that changes).

stage_appliance() {
  stage_begin appliance
  local pip dir
  pip=${PYTHON_WHEEL_PIP:-$REPO/.venv/bin/pip}
  dir=$OUT/wheel
  rm -rf "$dir"
  mkdir -p "$dir"
  if ! (cd "$REPO" && "$pip" wheel --quiet --no-deps -w "$dir" .) >"$OUT/wheel.log" 2>&1; then
    cat "$OUT/wheel.log" >&2
    die "pip wheel of the checkout failed"
  fi
  APPLIANCE_WHEEL=$(find "$dir" -name 'appliance-*.whl' | head -n1)
  [ -n "$APPLIANCE_WHEEL" ] || die "pip wheel produced no appliance wheel"
  stage_end "$(basename "$APPLIANCE_WHEEL")"
}
