#!/usr/bin/env bash
# Sharded checkpoints (issue 23): the save of ZeRO stage 2 + AdamW at 4 ranks (threads over shm,
# one process) in today's consolidated format (consolidate_state_dict, rank 0 writes one fsynced
# file) and in the sharded format (every rank its own file, rank 0 the manifest), ROUNDS
# interleaved rounds (order alternated), each ended by a barrier; prints both times and their
# ratio per round and the medians. The benchmark itself is the disabled test
# ShardedCheckpoint.DISABLED_BenchSaveFourRanks in tests/torch/test_sharded_checkpoint.cpp.
#
#   bench/run_sharded_ckpt_bench.sh [BUILD_DIR]
#   env: ROUNDS (7), WIDTH (1024: a 1024-2048-1024 MLP, 4.2 M parameters), DIR (a folder on the
#        disk to measure; default the temp folder)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
exe=$build/tests/torch/test_sharded_checkpoint
[ -x "$exe" ] || { echo "missing $exe: build the target test_sharded_checkpoint first" >&2; exit 1; }
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
GZ_BENCH_ROUNDS=${ROUNDS:-7} GZ_BENCH_WIDTH=${WIDTH:-1024} GZ_BENCH_DIR=${DIR:-${TMPDIR:-/tmp}} \
  "$exe" --gtest_also_run_disabled_tests --gtest_filter='ShardedCheckpoint.DISABLED_BenchSaveFourRanks' |
  grep -E '^(sharded checkpoint|round|median)'
