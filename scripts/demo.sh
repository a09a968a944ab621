#!/usr/bin/env bash
# The main job: bootstrap, build, then train the Fashion-MNIST CNN on two processes with gzrun.
# Extra arguments go to gz-train (e.g. --num_epochs 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh
echo "== build"
# Only what the demo runs. A fresh build/ leaves the tests out (GoogleTest may not be installed);
# an existing one keeps its GZ_BUILD_TESTS, so test.sh's build/ is not reconfigured by the demo.
tests_flag=-DGZ_BUILD_TESTS=OFF
[ -f build/CMakeCache.txt ] && tests_flag=
GZ_TARGETS="gzrun gz-train" scripts/build.sh $tests_flag
echo "== train: gzrun --nproc-per-node 2 gz-train --config configs/fashion_mnist.yaml $*"
start=$(date +%s)
build/tools/gzrun/gzrun --nproc-per-node 2 build/apps/gz-train/gz-train --config configs/fashion_mnist.yaml "$@"
echo "== demo finished in $(( $(date +%s) - start )) s (training only)"
