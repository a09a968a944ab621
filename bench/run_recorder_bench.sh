#!/usr/bin/env bash
# What the flight recorder costs: 4 KiB f32 all-reduces on two communicators over the same ranks,
# one recording and one not, in alternating rounds (gz-bench recorder), 2 ranks through gzrun.
# Prints the load before and after and gz-bench's RESULT line (median ratio on/off).
# Then the same with the recorder off on both (--control): the bias of the method on this machine.
#   bench/run_recorder_bench.sh [BUILD_DIR]      env: ROUNDS (2000), ITERS (50), BYTES (4K), BACKEND (shm)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
build=${1:-build}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores), $(git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%F)"
"$build/tools/gzrun/gzrun" --nproc-per-node 2 "$build/tools/gz-bench/gz-bench" recorder --backend "${BACKEND:-shm}" \
  --bytes "${BYTES:-4K}" --rounds "${ROUNDS:-2000}" --iters "${ITERS:-50}"
"$build/tools/gzrun/gzrun" --nproc-per-node 2 "$build/tools/gz-bench/gz-bench" recorder --backend "${BACKEND:-shm}" \
  --bytes "${BYTES:-4K}" --rounds "${ROUNDS:-2000}" --iters "${ITERS:-50}" --control
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
