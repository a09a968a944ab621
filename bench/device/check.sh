#!/usr/bin/env bash
# Run on the lent GPU machine from the repository root, after bench/device/prepare.sh here.
# Device check (one H200): build gz's NCCL backend and LibTorch layers against the image's CUDA,
# NCCL and PyTorch; run test_nccl; train the Fashion-MNIST cnn on the GPU (single, then DDP over
# gz's NCCL backend under gzrun). Everything logged under $OUT.
set -uo pipefail
root=$PWD
SYS=$root/.devcarry/sysroot/usr
L=$SYS/lib/x86_64-linux-gnu
log=$OUT/device.log
exec > >(tee "$log") 2>&1
T0=$(date +%s)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
el "== probe"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
uname -r; head -2 /etc/os-release; ldd --version | head -1; nproc; free -g | head -2
g++ --version | head -1; cmake --version | head -1; ninja --version; which nvcc; nvcc --version | tail -2
python3 -c "import torch;print('torch',torch.__version__,'cuda',torch.version.cuda,torch.cuda.is_available(),torch.utils.cmake_prefix_path, 'cxx11abi', torch._C._GLIBCXX_USE_CXX11_ABI)"
NCCL_PY=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
ls "$NCCL_PY" "$NCCL_PY/lib" "$NCCL_PY/include" 2>&1 | head -20
TORCH=$(python3 -c "import torch;print(torch.utils.cmake_prefix_path)")
mkdir -p /tmp/nccl/lib && ln -sf "$NCCL_PY/include" /tmp/nccl/include && ln -sf "$NCCL_PY/lib/libnccl.so.2" /tmp/nccl/lib/libnccl.so
# Debian's libz.so points at /lib/x86_64-linux-gnu/libz.so.1.2.13: point it at this system's.
z=$(ldconfig -p | awk '/libz.so.1 .*x86-64/ {print $NF; exit}'); [ -n "$z" ] && ln -sf "$z" "$L/libz.so"
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$(which nvcc)")")")
export LD_LIBRARY_PATH=$L:$NCCL_PY/lib:$TORCH/../../lib:${LD_LIBRARY_PATH:-}
export TORCH_CUDA_ARCH_LIST=9.0
cfg() {  # BUILD_DIR TORCH(ON|OFF)
  cmake -S "$root" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGZ_WITH_GLOO=OFF -DGZ_WITH_MPI=OFF \
    -DGZ_WITH_PYTHON=OFF -DGZ_WITH_NCCL=ON -DNCCL_ROOT=/tmp/nccl -DCUDAToolkit_ROOT="$CUDA_ROOT" \
    -DGZ_WITH_TORCH="$2" -DCMAKE_PREFIX_PATH="$SYS;$TORCH" -DOPENSSL_ROOT_DIR="$SYS" \
    -DCMAKE_LIBRARY_PATH="$L" -DGZ_BUILD_TESTS=ON >"$OUT/cmake-$2.log" 2>&1
}
el "== configure (torch ON)"
B=/tmp/b
if ! cfg $B ON; then tail -40 "$OUT/cmake-ON.log"; el "torch configure failed: LibTorch-free build"; B=/tmp/b0; cfg $B OFF || { tail -40 "$OUT/cmake-OFF.log"; exit 1; }; fi
grep -E "guozhuang:|NCCL:|Torch|CUDA" "$OUT"/cmake-*.log | head -12
el "== build test_nccl"
ninja -C $B -j16 test_nccl >"$OUT/build-nccl.log" 2>&1 || { grep -m20 -E "error|Error" "$OUT/build-nccl.log"; tail -20 "$OUT/build-nccl.log"; exit 1; }
el "== test_nccl"
timeout 240 $B/tests/comm/test_nccl --gtest_brief=0 2>&1 | tee "$OUT/test_nccl.txt" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|Skipped|skip" | head -60
el "test_nccl exit ${PIPESTATUS[0]}"
[ "$B" = /tmp/b ] || exit 0
el "== build gz-train, gzrun"
ninja -C $B -j16 gz-train gzrun >"$OUT/build-train.log" 2>&1 || { grep -m30 -E "error" "$OUT/build-train.log"; el "train build failed"; exit 1; }
el "built"
T=$B/apps/gz-train/gz-train
common=(--config "$root/configs/fashion_mnist.yaml" --train_data "$root/.devcarry/fmnist" --test_data "$root/.devcarry/fmnist" --device cuda --progress false --log_every 100 --num_threads 4)
el "== train: single process, cuda, 2 epochs, fp32"
timeout 150 $T "${common[@]}" --mode single --num_epochs 2 --work_dir /tmp/w1 2>&1 | tail -8
el "== train: gzrun 1 proc, ddp over gz nccl, cuda, fp16 (GradScaler), 1 epoch"
timeout 120 $B/tools/gzrun/gzrun --nproc-per-node 1 --master-port 0 -- $T "${common[@]}" --mode ddp --backend nccl --mixed_precision fp16 --num_epochs 1 --work_dir /tmp/w2 2>&1 | tail -8
el "== train: bf16 autocast, single, 1 epoch"
timeout 90 $T "${common[@]}" --mode single --mixed_precision bf16 --num_epochs 1 --work_dir /tmp/w3 2>&1 | tail -4
el "done"
