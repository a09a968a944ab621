#!/usr/bin/env bash
# Training throughput: gz (DDP, Horovod-style, DP) vs PyTorch DDP over gloo, 1 and 2 ranks, one
# thread per rank, for the cnn and bert-small models. Prints a table with the scaling efficiency
# (2-rank samples/s / (2 x 1-rank samples/s)) and the ratio gz / PyTorch.
#
#   bench/run_train_bench.sh [BUILD_DIR]     (env: STEPS, WARMUP, CNN_BATCH, BERT_BATCH, SEQ, MODELS)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
py=/usr/bin/python3  # Debian's python3 has torch; the one on PATH may not
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
CNN_BATCH=${CNN_BATCH:-64}
BERT_BATCH=${BERT_BATCH:-8}
SEQ=${SEQ:-128}
MODELS=${MODELS:-"cnn bert-small"}
for f in "$gzrun" "$bench"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
log=$(mktemp -d)/train_bench.log

# run NAME CMD...: run CMD, keep its RESULT samples/s in the associative array res[NAME].
declare -A res
run() {
  local name=$1; shift
  echo "== $name: $*" >>"$log"
  local out
  if ! out=$("$@" 2>&1); then
    echo "$out" >>"$log"
    echo "FAILED: $name (see $log)" >&2
    res[$name]=nan
    return
  fi
  echo "$out" >>"$log"
  res[$name]=$(echo "$out" | sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' | tail -1)
  [ -n "${res[$name]}" ] || res[$name]=nan
  printf '  %-28s %10s samples/s\n' "$name" "${res[$name]}" >&2
}

for model in $MODELS; do
  if [ "$model" = cnn ]; then batch=$CNN_BATCH; else batch=$BERT_BATCH; fi
  common=(--model "$model" --batch "$batch" --steps "$STEPS" --warmup "$WARMUP" --threads 1 --seq "$SEQ")
  echo "model $model, batch $batch per rank, $STEPS steps:" >&2
  run "$model/gz-single-1"  "$bench" train "${common[@]}" --mode single
  for mode in ddp horovod; do
    for n in 1 2; do
      run "$model/gz-$mode-$n" "$gzrun" --nproc-per-node "$n" --master-port 0 -- "$bench" train "${common[@]}" --mode "$mode"
    done
  done
  run "$model/gz-dp-2" "$bench" train "${common[@]}" --mode dp
  for n in 1 2; do
    run "$model/torch-ddp-$n" "$py" "$root/bench/ddp_bench.py" --model "$model" --nproc "$n" --batch "$batch" \
      --steps "$STEPS" --warmup "$WARMUP" --threads 1 --seq "$SEQ"
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.3f", a / b }'; }
scal() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.3f", a / (2 * b) }'; }
echo
printf '%-11s %-8s %12s %12s %9s %14s\n' model impl "1-rank s/s" "2-rank s/s" scaling "vs torch 2-rk"
for model in $MODELS; do
  t1=${res[$model/torch-ddp-1]}; t2=${res[$model/torch-ddp-2]}
  for impl in gz-ddp gz-horovod torch-ddp; do
    a=${res[$model/$impl-1]}; b=${res[$model/$impl-2]}
    printf '%-11s %-8s %12s %12s %9s %14s\n' "$model" "${impl#gz-}" "$a" "$b" "$(scal "$b" "$a")" "$(ratio "$b" "$t2")"
  done
  a=${res[$model/gz-single-1]}; b=${res[$model/gz-dp-2]}
  printf '%-11s %-8s %12s %12s %9s %14s\n' "$model" "dp" "$a" "$b" "$(scal "$b" "$a")" "$(ratio "$b" "$t2")"
  printf '%-11s %-8s %s\n' "$model" "" "horovod/ddp (2 ranks): $(ratio "${res[$model/gz-horovod-2]}" "${res[$model/gz-ddp-2]}")"
done
echo "(targets: ddp scaling >= 0.97, ddp >= 1.2x torch, horovod within 5% of ddp; log: $log)"
