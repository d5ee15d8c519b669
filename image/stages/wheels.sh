# shellcheck shell=bash
# Stage wheels: the arm64 (cp311, manylinux) wheels pinned in wheels.lock, downloaded on the host, cached.

WHEEL_PLATFORMS=(manylinux2014_aarch64 manylinux_2_28_aarch64 manylinux_2_34_aarch64 manylinux_2_36_aarch64)

stage_wheels() {
  stage_begin wheels
  local key dir pip
  key=$(hash_inputs "$IMAGE_DIR/wheels.lock" "$IMAGE_DIR/stages/wheels.sh")
  dir=$CACHE/wheels-$key
  WHEELHOUSE=$dir
  if [ -d "$dir" ]; then
    stage_end "cached $(basename "$dir")"
    return
  fi
  pip=${PYTHON_WHEEL_PIP:-$REPO/.venv/bin/pip}
  local -a plat=()
  local p
  for p in "${WHEEL_PLATFORMS[@]}"; do plat+=(--platform "$p"); done
  rm -rf "$dir.part"
  "$pip" download --quiet --no-deps --require-hashes --only-binary=:all: "${plat[@]}" \
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
    -d "$dir.part" -r "$IMAGE_DIR/wheels.lock" >&2
  mv "$dir.part" "$dir"
  find "$CACHE" -maxdepth 1 -name 'wheels-*' ! -name "$(basename "$dir")" -exec rm -rf {} +
  stage_end "downloaded $(find "$dir" -name '*.whl' | wc -l) wheels"
}
