#!/usr/bin/env bash
# Multi-process collectives through the real launcher: gzrun starts 3 rank processes of gz-bench,
# which runs every op x dtype on shm, gloo and auto and checks each result against a reference
# (gz-bench's once-per-size check; a wrong element fails the run). Sizes cover several chunks
# (GZ_SHM_CHUNK_BYTES is small) and odd element counts.
#   gzrun_collectives.sh GZRUN GZ_BENCH
set -euo pipefail
gzrun=$1 bench=$2
export GZ_SHM_CHUNK_BYTES=4096 GZ_TIMEOUT_S=60
fail=0
for op in allreduce broadcast allgather reduce_scatter; do
  for dtype in f32 f64 f16 bf16 i8 u8 i32 i64; do
    reduces=sum
    [ "$op" = allreduce ] && reduces="sum avg min max prod"
    for red in $reduces; do
      if ! out=$("$gzrun" --nproc-per-node 3 --master-port 0 -- "$bench" collectives --op "$op" --dtype "$dtype" \
          --reduce "$red" --backend shm,gloo,auto --sizes 96:24K:x4 --iters 2 --warmup 1 2>&1); then
        echo "FAILED: $op $dtype $red"; echo "$out" | tail -n 20; fail=1
      fi
    done
  done
done
[ $fail = 0 ] && echo "all ops x dtypes x {shm,gloo,auto} correct on 3 processes"
exit $fail
