#!/usr/bin/env bash
# Build Guozhuang against LibTorch 2.x and run the whole release test suite there.
#
# Debian 13 (trixie) ships libtorch-dev 2.6 (CPU) with GCC 14; this script debootstraps a trixie
# root into DIR (kept between runs), installs the project's dependencies there with
# scripts/bootstrap.sh, copies the current checkout in (tracked files plus uncommitted changes) and
# runs the build and ctest inside it. The host's own LibTorch 1.13 build is untouched.
#
#   sudo scripts/check-libtorch2.sh [DIR]      (default /var/tmp/gz-trixie)
#   env: GZ_TEST_JOBS (2), GZ_MIRROR (http://deb.debian.org/debian), GZ_TARGETS (build only these,
#        e.g. "gz_python_ext gzrun"), GZ_CTEST_ARGS (e.g. "-L python": run only those tests)
# Needs root (debootstrap, chroot, mounts) and access to a Debian mirror; about 2 GiB in DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/gz-trixie}
mirror=${GZ_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "check-libtorch2: run as root (debootstrap and chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
if [ ! -x "$dir/usr/bin/apt-get" ]; then
  echo "== debootstrap trixie into $dir"
  debootstrap --variant=minbase trixie "$dir" "$mirror" >/dev/null
fi
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
for m in proc dev dev/pts dev/shm; do
  mountpoint -q "$dir/$m" && continue
  case $m in
    proc) mount -t proc proc "$dir/proc" ;;
    dev/pts) mount -t devpts devpts "$dir/dev/pts" ;;
    *) mount --bind "/$m" "$dir/$m" ;;
  esac
  mounted+=("$dir/$m")
done
cp /etc/resolv.conf "$dir/etc/resolv.conf"
echo "== copy the checkout to $dir/src"
mkdir -p "$dir/src"
# Tracked and untracked-but-not-ignored files, as they are now. The root's own build/ and ccache
# (from earlier runs of this script) are kept, so a second run builds incrementally.
find "$dir/src" -mindepth 1 -maxdepth 1 ! -name build ! -name .ccache -exec rm -rf {} +
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp -a --parents -t "$dir/src/")
chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root GZ_TEST_JOBS="${GZ_TEST_JOBS:-2}" \
  GZ_TARGETS="${GZ_TARGETS:-}" GZ_CTEST_ARGS="${GZ_CTEST_ARGS:-}" GZ_JOBS="${GZ_JOBS:-}" bash -c '
  set -euo pipefail
  cd /src
  scripts/bootstrap.sh test
  v=/usr/include/torch/csrc/api/include/torch/version.h
  echo "== LibTorch $(awk "/define TORCH_VERSION_(MAJOR|MINOR|PATCH) /{printf \"%s%s\", s, \$3; s=\".\"}" $v), $(g++ --version | head -n1)"
  echo "== build"
  scripts/build.sh
  echo "== ctest"
  cd build && ctest --output-on-failure -j "$GZ_TEST_JOBS" --timeout 600 $GZ_CTEST_ARGS
'
echo "check-libtorch2: LibTorch 2.x build and tests passed"
