#!/usr/bin/env bash
# The Python targets of issue 15 in one command (hold the benchmark lock):
#   flock /work/.bench.lock bench/run_python_ab.sh [BUILD_DIR] [OUT]
# PyTorch's DDP in Python at 2 ranks, cnn batch 64 and bert-small batch 8: Gloo, "gz", the
# no-communication ceiling and guozhuang.torch's Horovod mode, interleaved in the same processes
# (bench/python_ab_bench.py). env: CNN_ROUNDS (20), BERT_ROUNDS (16).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
out=${2:-/dev/stdout}
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
{
  echo "# $(date -u +%FT%TZ) commit $(git -C "$root" rev-parse --short HEAD) $(getconf _NPROCESSORS_ONLN) cores; before: $(uptime)"
  "$build/tools/gzrun/gzrun" --nproc-per-node 2 /usr/bin/python3 "$root/bench/python_ab_bench.py" --model cnn \
    --batch 64 --rounds "${CNN_ROUNDS:-20}" --block 10 2>&1 | grep -v -i warn
  "$build/tools/gzrun/gzrun" --nproc-per-node 2 /usr/bin/python3 "$root/bench/python_ab_bench.py" --model bert-small \
    --batch 8 --rounds "${BERT_ROUNDS:-16}" --block 3 --warmup 3 2>&1 | grep -v -i warn
  echo "# after: $(uptime)"
} >"$out"
