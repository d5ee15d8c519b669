#!/bin/sh
# Install the appliance on a Debian device: the ONE install script, used by the SD-card image build (in its arm64
# chroot) and by the Vagrantfile (in each VM). POSIX sh (the image runs it with /bin/sh), idempotent, root only.
#
#   install-appliance.sh [--wheel FILE | --source DIR] [--wheelhouse DIR] [--prefix DIR] [--apt] [--start]
#
#   --wheel FILE      the appliance wheel to install (the image build makes one from the checkout)
#   --source DIR      or build it from a source checkout (Vagrant: the synced repository)
#   --wheelhouse DIR  install dependencies from these wheels only (offline, pinned); default: pip's configured index
#   --prefix DIR      the venv (default /opt/appliance); it sees Debian's python3-* packages (--system-site-packages)
#   --apt             apt-get install the Debian packages the appliance uses (the image's package list has them)
#   --start           (re)start the units now if the device is provisioned (a live system, not a chroot)
#
# Result: PREFIX/bin/appliance, the `appliance` system user, /etc/appliance (0750 root:appliance) with secrets/
# (0700 appliance), the units from systemd/ in /usr/lib/systemd/system, enabled: appliance.service,
# appliance-upload.timer, appliance-firstboot.service.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
units_src=$(cd "$here/../systemd" && pwd)
prefix=/opt/appliance
wheel=
source_dir=
wheelhouse=
use_apt=0
start=0
extras=device

die() { echo "install-appliance: $*" >&2; exit 1; }
say() { echo "install-appliance: $*" >&2; }

while [ $# -gt 0 ]; do
  case $1 in
    --wheel) wheel=${2:?--wheel needs a file}; shift 2 ;;
    --source) source_dir=${2:?--source needs a directory}; shift 2 ;;
    --wheelhouse) wheelhouse=${2:?--wheelhouse needs a directory}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --apt) use_apt=1; shift ;;
    --start) start=1; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

[ "$(id -u)" = 0 ] || die "must run as root"
[ -n "$wheel" ] || [ -n "$source_dir" ] || die "give --wheel FILE or --source DIR"
[ -z "$wheel" ] || [ -z "$source_dir" ] || die "give only one of --wheel and --source"
[ -z "$wheel" ] || [ -f "$wheel" ] || die "no wheel at $wheel"
[ -z "$source_dir" ] || [ -f "$source_dir/pyproject.toml" ] || die "no pyproject.toml in $source_dir"
[ -z "$wheelhouse" ] || [ -d "$wheelhouse" ] || die "no wheelhouse at $wheelhouse"
for unit in appliance.service appliance-upload.service appliance-upload.timer appliance-firstboot.service \
    appliance.sysusers; do
  [ -f "$units_src/$unit" ] || die "missing $units_src/$unit"
done

# 1. Debian packages: Python, venv, and the dependencies Debian ships (systemd-python needs libsystemd to build);
#    a C compiler and Python's headers so that a --source install builds the delivery log's C recorder.
if [ "$use_apt" = 1 ]; then
  say "apt packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3 python3-venv python3-systemd python3-wsproto \
    python3-cffi ca-certificates systemd gcc libc6-dev python3-dev >/dev/null
fi
command -v python3 >/dev/null || die "python3 is missing (use --apt, or the image's package list)"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "python3 >= 3.11 needed"

# 2. The venv and the appliance with its device extras.
if [ ! -x "$prefix/bin/python" ]; then
  say "venv $prefix"
  python3 -m venv --system-site-packages "$prefix"
fi
pip_opts="--quiet --disable-pip-version-check --no-cache-dir --root-user-action=ignore"
if [ -n "$wheelhouse" ]; then
  pip_opts="$pip_opts --no-index --find-links $wheelhouse"
fi
target=${wheel:-$source_dir}
say "appliance[$extras] from $target${wheelhouse:+ (wheelhouse $wheelhouse)}"
# shellcheck disable=SC2086 # pip_opts is a word list
"$prefix/bin/pip" install $pip_opts "$target[$extras]"
# Same version number, new code (a rebuilt wheel or an edited checkout): replace the package itself, not its deps.
# shellcheck disable=SC2086
"$prefix/bin/pip" install $pip_opts --no-deps --force-reinstall "$target"
"$prefix/bin/python" -c 'import appliance, provisioning.firstboot, appliance.server.systemd' ||
  die "the installed appliance does not import"
if ! "$prefix/bin/python" -c 'from appliance.deliverylog.batch import NativeRecorder; assert NativeRecorder' 2>/dev/null
then  # the image adds it after this script (its recorder stage); a --source install without gcc lands here
  say "note: no C recorder built: the delivery log uses its slower Python lanes"
fi
for cmd in appliance appliance-provision; do
  ln -sf "$prefix/bin/$cmd" "/usr/local/bin/$cmd"
done

# 3. The system user, the config directory (first boot fills it), the units.
install -D -m 0644 "$units_src/appliance.sysusers" /usr/lib/sysusers.d/appliance.conf
systemd-sysusers /usr/lib/sysusers.d/appliance.conf
getent passwd appliance >/dev/null || die "systemd-sysusers did not create the appliance user"
install -d -m 0750 -o root -g appliance /etc/appliance
install -d -m 0700 -o appliance -g appliance /etc/appliance/secrets
# First boot may install root's authorized_keys here (its sandbox can only make an existing path writable).
install -d -m 0700 -o root -g root /root/.ssh
unit_dir=/usr/lib/systemd/system
for unit in appliance.service appliance-upload.service appliance-upload.timer appliance-firstboot.service; do
  sed "s#/opt/appliance/#$prefix/#g" "$units_src/$unit" >"$unit_dir/$unit.tmp"
  chmod 0644 "$unit_dir/$unit.tmp"
  mv "$unit_dir/$unit.tmp" "$unit_dir/$unit"
done

# systemctl enable works on unit files alone (a chroot or a stopped system); reload only a running manager.
booted=0
[ -d /run/systemd/system ] && booted=1
[ "$booted" = 1 ] && systemctl daemon-reload
systemctl enable --quiet appliance.service appliance-upload.timer appliance-firstboot.service
say "enabled appliance.service, appliance-upload.timer, appliance-firstboot.service"

if [ "$start" = 1 ]; then
  [ "$booted" = 1 ] || die "--start needs a running systemd"
  if [ -d /boot/firmware/appliance ]; then
    systemctl restart appliance-firstboot.service
  fi
  if [ -f /etc/appliance/appliance.toml ]; then
    systemctl restart appliance.service
    systemctl start appliance-upload.timer
    say "started appliance.service: $(systemctl show -p StatusText --value appliance.service)"
  else
    say "not provisioned (/etc/appliance/appliance.toml missing): appliance.service waits for a bundle"
  fi
fi
say "done"
