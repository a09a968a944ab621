#!/usr/bin/env bash
# Run on the lent GPU machine from the repository root, after bench/device/prepare.sh here.
# Device machine as a quiet 16-core CPU host: issue 21's cost A/B (bench/run_observability_ab.sh)
# and, time permitting, issue 22's checkpoint cost (bench/run_snapshot_bench.sh PARTS=ckpt).
set -uo pipefail
root=$PWD
SYS=$root/.devcarry/sysroot/usr
L=$SYS/lib/x86_64-linux-gnu
exec > >(tee "$OUT/device_bench.log") 2>&1
T0=$(date +%s)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz" ; cat /proc/loadavg
TORCH=$(python3 -c "import torch;print(torch.utils.cmake_prefix_path)")
NCCL_PY=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
z=$(ldconfig -p | awk '/libz.so.1 .*x86-64/ {print $NF; exit}'); [ -n "$z" ] && ln -sf "$z" "$L/libz.so"
export LD_LIBRARY_PATH=$L:$NCCL_PY/lib:$TORCH/../../lib:${LD_LIBRARY_PATH:-}
export TORCH_CUDA_ARCH_LIST=9.0 CUDA_VISIBLE_DEVICES=""
mkdir -p /usr/share/datasets && ln -sfn "$root/.devcarry/fmnist" /usr/share/datasets/fashion-mnist
el "configure"
cmake -S "$root" -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGZ_WITH_GLOO=OFF -DGZ_WITH_MPI=OFF \
  -DGZ_WITH_PYTHON=OFF -DGZ_WITH_NCCL=OFF -DGZ_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$SYS;$TORCH" \
  -DOPENSSL_ROOT_DIR="$SYS" -DCMAKE_LIBRARY_PATH="$L" -DGZ_BUILD_TESTS=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C /tmp/b -j16 gz-train gzrun >"$OUT/build.log" 2>&1 || { grep -m20 error "$OUT/build.log"; exit 1; }
el "built"
cd "$root"
# 3 rounds took ~8 min there (2026-11-28): more than one call allows after the build.
AUTOGROUP_NICE=off ROUNDS=${ROUNDS:-2} KEEP=/tmp/ab bench/run_observability_ab.sh /tmp/b 2>&1 | tee "$OUT/ab.txt"
el "ab done"
left=$((560 - ($(date +%s) - T0)))
if [ "$left" -gt 120 ]; then
  AUTOGROUP_NICE=off PARTS=ckpt ROUNDS=1 KEEP=/tmp/ck timeout "$left" bench/run_snapshot_bench.sh /tmp/b 2>&1 | tee "$OUT/ckpt.txt"
fi
el "done"
