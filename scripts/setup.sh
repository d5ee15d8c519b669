#!/usr/bin/env bash
# One-shot, idempotent machine + venv set-up for development, tests and CI.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"

APT_PACKAGES=(
  mosquitto mosquitto-clients iproute2 nftables
  mmdebstrap arch-test qemu-user-static binfmt-support qemu-system-arm qemu-system-x86 qemu-utils ipxe-qemu
  mtools dosfstools e2fsprogs fdisk xz-utils zstd
  libsystemd-dev pkg-config systemd gcc libc6-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross
  vagrant openjdk-17-jre-headless
)

need_apt=0
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || { need_apt=1; break; }
done
if [ "$need_apt" = 1 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
# The stamp covers what pip builds: the metadata, and the C recorder (setup.py's optional extension).
stamp=.venv/.installed-$(cat pyproject.toml setup.py appliance/deliverylog/_recorder.c | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "setup: installing Python packages" >&2
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[all]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "setup: ok" >&2
