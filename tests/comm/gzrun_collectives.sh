#!/usr/bin/env bash
# Multi-process collectives through the real launcher: gzrun starts 3 rank processes of gz-bench,
# which runs every op x dtype on shm, gloo and auto and checks each result against a reference
# (gz-bench's once-per-size check; a wrong element fails the run). Sizes cover several chunks
# (GZ_SHM_CHUNK_BYTES is small) and odd element counts.
#   gzrun_collectives.sh GZRUN GZ_BENCH
set -euo pipefail
gzrun=$1 bench=$2
export GZ_SHM_CHUNK_BYTES=4096 GZ_TIMEOUT_S=60
# One launch sweeps every op x dtype x reduce (the reduce where the op reduces): the ranks load
# their libraries once instead of 64 times (~2 s each).
if ! out=$("$gzrun" --nproc-per-node 3 --master-port 0 -- "$bench" collectives \
    --op allreduce,broadcast,allgather,reduce_scatter --dtype f32,f64,f16,bf16,i8,u8,i32,i64 \
    --reduce sum,avg,min,max,prod --backend shm,gloo,auto --sizes 96:24K:x4 --iters 2 --warmup 1 2>&1); then
  echo "FAILED:"; echo "$out" | grep -E "WRONG|error" | head -n 20 || true; echo "$out" | tail -n 20
  exit 1
fi
# Every combination ran on every backend: 8 dtypes x (5 allreduce + 1 broadcast + 1 allgather
# + 5 reduce_scatter) x 3 backends.
# A header is printed before its sweep runs; a sweep that was skipped says so.
sweeps=$(grep -c '^\[0\] # backend .* op .* dtype' <<<"$out" || true)
if grep -q 'skipped' <<<"$out"; then
  echo "FAILED: a backend or combination was skipped"; grep 'skipped' <<<"$out" | head -n 20
  exit 1
fi
if [ "$sweeps" != 288 ]; then
  echo "FAILED: $sweeps sweeps ran, not 288"; echo "$out" | grep '# backend' | head -n 20
  exit 1
fi
echo "all ops x dtypes x reduces x {shm,gloo,auto} correct on 3 processes ($sweeps sweeps)"
