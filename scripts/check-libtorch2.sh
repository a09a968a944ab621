#!/usr/bin/env bash
# Build Guozhuang against LibTorch 2.x and run its tests there.
#
# Debian 13 (trixie) ships libtorch-dev and python3-torch 2.6 (CPU) with GCC 14 and Python 3.13;
# this script debootstraps a trixie root into DIR (kept between runs), installs the project's
# dependencies there with scripts/bootstrap.sh, copies the current checkout in (tracked files plus
# uncommitted changes) and runs the build and ctest inside it. The host's own build is untouched:
# the root has its own build/ (DIR/src/build, kept between runs, so a second run builds
# incrementally) and its own compiler cache, DIR-ccache, mounted into the root: it outlives the
# root itself, so a root made again on the same machine still builds from the cache.
#
#   sudo scripts/check-libtorch2.sh [DIR]      (default /var/tmp/gz-trixie)
#   env: GZ_LIBTORCH2_SCOPE  all (default): every target and every test
#                            torch: only what depends on the LibTorch version (target
#                            gz_libtorch_dependents: the LibTorch layer, trainer, Python package,
#                            their tests and the binaries those start; ctest -L 'torch|python';
#                            packages: bootstrap.sh's libtorch2 profile, no clang or etcd).
#                            scripts/test.sh's LibTorch 2.x stage uses this.
#        GZ_TARGETS (build only these), GZ_CTEST_ARGS (e.g. "-L python": run only those tests),
#        GZ_TEST_JOBS (2), GZ_JOBS (build jobs), GZ_MIRROR (http://deb.debian.org/debian),
#        GZ_LIBTORCH2_OPT (compiler flags of the build, "-O1 -DNDEBUG"): -O1 without debug info
#        compiles the LibTorch translation units 2-2.5x faster than the host's -O2 -g (their
#        precompiled header and objects are smaller too); the tests only need correct code.
#        GZ_LIBTORCH2_CCACHE (DIR-ccache): the compiler cache's directory on the host.
# Needs root (debootstrap, chroot, mounts) and access to a Debian mirror; about 2.5 GiB in DIR.
#
# USE_LIBUV=0 is set inside the root: Debian's torch 2.6 is built without libuv, while its
# TCPStore (env:// and tcp:// init) asks for libuv by default and fails with "use_libuv was
# requested but PyTorch was build without libuv support" -- a plain torch.distributed gloo script
# fails the same way (python/tests/test_launch.py shows it). Users of that torch need the same
# variable (docs/python.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/var/tmp/gz-trixie}
mirror=${GZ_MIRROR:-http://deb.debian.org/debian}
cache=${GZ_LIBTORCH2_CCACHE:-$dir-ccache}
opt=${GZ_LIBTORCH2_OPT:--O1 -DNDEBUG}
scope=${GZ_LIBTORCH2_SCOPE:-all}
case $scope in
  all) targets=${GZ_TARGETS:-}; ctest_args=${GZ_CTEST_ARGS:-}; profile=test ;;
  torch) targets=${GZ_TARGETS:-gz_libtorch_dependents}; ctest_args=${GZ_CTEST_ARGS:--L torch|python}; profile=libtorch2 ;;
  *) echo "check-libtorch2: GZ_LIBTORCH2_SCOPE must be 'all' or 'torch', not '$scope'" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "check-libtorch2: run as root (debootstrap and chroot)" >&2; exit 1; }
t0=$(date +%s)
phase() { echo "== [$(($(date +%s) - t0)) s] $*"; }
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
# One run at a time per root (the mounts and the copy below are not shareable).
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/usr/bin/apt-get" ]; then
  phase "debootstrap trixie into $dir"
  [ "$dir" != / ] && rm -rf "$dir"
  debootstrap --variant=minbase trixie "$dir" "$mirror" >"$dir.debootstrap.log" 2>&1 ||
    { tail -n 20 "$dir.debootstrap.log"; echo "check-libtorch2: debootstrap failed" >&2; exit 1; }
fi
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
mkdir -p "$cache" "$dir/var/cache/gz-ccache"
for m in proc dev dev/pts dev/shm var/cache/gz-ccache; do
  mountpoint -q "$dir/$m" && continue
  case $m in
    proc) mount -t proc proc "$dir/proc" ;;
    dev/pts) mount -t devpts devpts "$dir/dev/pts" ;;
    var/cache/gz-ccache) mount --bind "$cache" "$dir/$m" ;;
    *) mount --bind "/$m" "$dir/$m" ;;
  esac
  mounted+=("$dir/$m")
done
cp /etc/resolv.conf "$dir/etc/resolv.conf"
phase "copy the checkout to $dir/src"
mkdir -p "$dir/src"
# Tracked and untracked-but-not-ignored files, as they are now. The root's own build/
# (from earlier runs of this script) is kept, so a second run builds incrementally.
find "$dir/src" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp -a --parents -t "$dir/src/")
chroot "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 USE_LIBUV=0 \
  GZ_TEST_JOBS="${GZ_TEST_JOBS:-2}" GZ_TARGETS="$targets" GZ_CTEST_ARGS="$ctest_args" GZ_JOBS="${GZ_JOBS:-}" \
  GZ_T0="$t0" GZ_PROFILE="$profile" GZ_OPT="$opt" CCACHE_DIR=/var/cache/gz-ccache CCACHE_MAXSIZE=5G bash -c '
  set -euo pipefail
  phase() { echo "== [$(($(date +%s) - GZ_T0)) s] $*"; }
  cd /src
  . scripts/ctest_stage.sh
  phase "packages (scripts/bootstrap.sh $GZ_PROFILE)"
  scripts/bootstrap.sh "$GZ_PROFILE"
  v=/usr/include/torch/csrc/api/include/torch/version.h
  phase "LibTorch $(awk "/define TORCH_VERSION_(MAJOR|MINOR|PATCH) /{printf \"%s%s\", s, \$3; s=\".\"}" $v), $(g++ --version | head -n1), $(python3 --version)"
  phase "build${GZ_TARGETS:+ ($GZ_TARGETS)}"
  scripts/build.sh -DGZ_BUILD_TESTS=ON "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$GZ_OPT" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$GZ_OPT"
  ccache --show-stats 2>/dev/null | grep -E "Hits|Misses" | head -n 3 || true
  phase "ctest${GZ_CTEST_ARGS:+ ($GZ_CTEST_ARGS)}"
  ctest_stage build -j "$GZ_TEST_JOBS" --timeout 600 $GZ_CTEST_ARGS
  # Each pytest suite is one ctest: print its own counts too.
  awk "/^[0-9]+\/[0-9]+ Test: / {name = \$3} name ~ /^python_/ && /(passed|failed|error).* in [0-9.]+s/ {print \"  \" name \": \" \$0}" \
    build/Testing/Temporary/LastTest.log
  phase "done"
'
echo "check-libtorch2: LibTorch 2.x build and tests passed"
