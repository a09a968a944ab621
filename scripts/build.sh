#!/usr/bin/env bash
# Configure and build into build/ (or $GZ_BUILD_DIR). Extra arguments go to cmake's configure step.
# GZ_TARGETS="a b": build only those targets (default: everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GZ_BUILD_DIR:-$root/build}
jobs=${GZ_JOBS:-$(nproc)}
# LibTorch translation units need ~1.5 GiB each while compiling; keep parallelism within memory.
mem_gb=$(awk '/MemAvailable/ {print int($2/1048576)}' /proc/meminfo)
[ "$jobs" -gt $((mem_gb / 2 + 1)) ] && jobs=$((mem_gb / 2 + 1))
export CCACHE_DIR=${CCACHE_DIR:-$root/.ccache}
# Precompiled headers are only cached with these (ccache manual, "Precompiled headers").
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${GZ_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
# Progress lines are dropped; the build's own exit status decides (grep's does not matter).
set +e
cmake --build "$build" -j "$jobs" ${GZ_TARGETS:+--target $GZ_TARGETS} 2>&1 | grep -v -E '^\[ *[0-9]+%\]|^-- '
status=${PIPESTATUS[0]}
set -e
[ "$status" = 0 ] || echo "build: cmake --build $build failed (exit $status)" >&2
exit "$status"
