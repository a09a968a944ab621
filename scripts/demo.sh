#!/usr/bin/env bash
# The main job: bootstrap, build, then train the Fashion-MNIST CNN on two processes with gzrun.
# Extra arguments go to gz-train (e.g. --num_epochs 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
echo "== build"
scripts/build.sh -DGZ_BUILD_TESTS=OFF
echo "== train: gzrun --nproc-per-node 2 gz-train --config configs/fashion_mnist.yaml $*"
start=$(date +%s)
build/tools/gzrun/gzrun --nproc-per-node 2 build/apps/gz-train/gz-train --config configs/fashion_mnist.yaml "$@"
echo "== demo finished in $(( $(date +%s) - start )) s (training only)"
