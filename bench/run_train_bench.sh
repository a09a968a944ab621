#!/usr/bin/env bash
# Training throughput: gz (DDP, Horovod-style, DP) vs PyTorch DDP over gloo, 1 and 2 ranks, one
# thread per rank, for the cnn and bert-small models. Every configuration runs REPEATS times,
# interleaved (so slow phases of a noisy machine hit all of them alike); the table shows medians,
# the scaling efficiency (2-rank samples/s / (2 x 1-rank samples/s)) and the ratio to PyTorch DDP.
# Two reference rows explain the scaling: two single processes running at once with no
# communication (what this machine allows), and DDP with its all-reduce skipped.
#
#   bench/run_train_bench.sh [BUILD_DIR]
#   env: REPEATS (3), CNN_STEPS (200), BERT_STEPS (30), WARMUP (5), CNN_BATCH (64), BERT_BATCH (8),
#        SEQ (128), MODELS ("cnn bert-small"), CSV (write the medians there too),
#        SCALING_ONLY (1: only the rows that bound DDP's scaling: single, the pair, DDP at 1 and 2
#        ranks, DDP without the all-reduce; the others print n/a)
set -euo pipefail
BENCH_DECIMALS=2
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
py=/usr/bin/python3  # Debian's python3 has torch; the one on PATH may not
REPEATS=${REPEATS:-3}
CNN_STEPS=${CNN_STEPS:-200}
BERT_STEPS=${BERT_STEPS:-30}
WARMUP=${WARMUP:-5}
CNN_BATCH=${CNN_BATCH:-64}
BERT_BATCH=${BERT_BATCH:-8}
SEQ=${SEQ:-128}
MODELS=${MODELS:-"cnn bert-small"}
CSV=${CSV:-}
SCALING_ONLY=${SCALING_ONLY:-0}
for f in "$gzrun" "$bench"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
log=$(mktemp -d)/train_bench.log
echo "log: $log" >&2

# result_of TEXT: the samples/s of the last RESULT line in TEXT (empty when there is none).
result_of() { echo "$1" | sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' | tail -1; }

# run NAME CMD...: run CMD, append its RESULT samples/s to res[NAME] (space-separated).
declare -A res
run() {
  local name=$1; shift
  echo "== $name: $*" >>"$log"
  local out v
  # A hung run (e.g. a rendezvous that never completes) costs RUN_TIMEOUT seconds, not the benchmark.
  if ! out=$(timeout "${RUN_TIMEOUT:-600}" "$@" 2>&1); then
    echo "$out" >>"$log"
    echo "FAILED: $name (see $log)" >&2
    v=nan
  else
    echo "$out" >>"$log"
    v=$(result_of "$out")
    [ -n "$v" ] || v=nan
  fi
  res[$name]="${res[$name]:-} $v"
  printf '  %-30s %10s samples/s\n' "$name" "$v" >&2
}
# run_pair NAME CMD...: two copies of CMD side by side, no communication; records the sum of their
# samples/s. pair / (2 x single) is what this machine allows two ranks without any communication:
# the ceiling of the scaling efficiency (shared memory bandwidth, caches, the hypervisor).
run_pair() {
  local name=$1; shift
  echo "== $name (two copies at once): $*" >>"$log"
  local d v a b
  d=$(mktemp -d)
  timeout "${RUN_TIMEOUT:-600}" "$@" >"$d/a" 2>&1 &
  local pa=$!
  timeout "${RUN_TIMEOUT:-600}" "$@" >"$d/b" 2>&1 &
  local pb=$!
  if wait $pa && wait $pb; then
    a=$(result_of "$(cat "$d/a")")
    b=$(result_of "$(cat "$d/b")")
    v=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a == "" || b == "") print "nan"; else printf "%.2f", a + b }')
  else
    v=nan
  fi
  cat "$d/a" "$d/b" >>"$log"
  rm -rf "$d"
  res[$name]="${res[$name]:-} $v"
  printf '  %-30s %10s samples/s\n' "$name" "$v" >&2
}

for rep in $(seq 1 "$REPEATS"); do
  for model in $MODELS; do
    if [ "$model" = cnn ]; then batch=$CNN_BATCH; steps=$CNN_STEPS; else batch=$BERT_BATCH; steps=$BERT_STEPS; fi
    common=(--model "$model" --batch "$batch" --steps "$steps" --warmup "$WARMUP" --threads 1 --seq "$SEQ")
    echo "repeat $rep/$REPEATS, model $model, batch $batch per rank, $steps steps:" >&2
    run "$model/gz-single-1" "$bench" train "${common[@]}" --mode single
    run_pair "$model/gz-single-pair" "$bench" train "${common[@]}" --mode single
    for n in 1 2; do
      run "$model/gz-ddp-$n" "$gzrun" --nproc-per-node "$n" --master-port 0 -- "$bench" train "${common[@]}" --mode ddp
      [ "$SCALING_ONLY" = 1 ] && continue
      run "$model/gz-horovod-$n" "$gzrun" --nproc-per-node "$n" --master-port 0 -- "$bench" train "${common[@]}" --mode horovod
      # The same DDP with LibTorch's own AdamW and dropout (bert-small; cnn uses neither).
      [ "$model" = cnn ] || run "$model/gz-ddp_stock-$n" "$gzrun" --nproc-per-node "$n" --master-port 0 -- \
        "$bench" train "${common[@]}" --mode ddp --kernels torch
      run "$model/torch-ddp-$n" "$py" "$root/bench/ddp_bench.py" --model "$model" --nproc "$n" --batch "$batch" \
        --steps "$steps" --warmup "$WARMUP" --threads 1 --seq "$SEQ"
    done
    # Diagnostic: DDP with the all-reduce skipped; between it and the pair above lies DDP's own
    # overhead, between it and gz-ddp-2 the cost of communication.
    run "$model/gz-ddp_nocomm-2" "$gzrun" --nproc-per-node 2 --master-port 0 -- "$bench" train "${common[@]}" \
      --mode ddp --hook none
    [ "$SCALING_ONLY" = 1 ] || run "$model/gz-dp-2" "$bench" train "${common[@]}" --mode dp
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.3f", a / b }'; }
scal() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.3f", a / (2 * b) }'; }
m() { median "${res[$1]:-}"; }
# per_round NUM DEN [K]: NUM's run i / (K x DEN's run i) for every round (runs of one round are
# minutes apart, so these ratios see less of the VM's slow phases than ratios of medians), then
# their median.
per_round() {
  local v
  v=$(awk -v a="${res[$1]:-}" -v b="${res[$2]:-}" -v k="${3:-2}" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; ++i) printf "%s%s", (i > 1 ? " " : ""), (x[i] == "nan" || y[i] == "nan" || y[i] == 0) ? "nan" : sprintf("%.3f", x[i] / (k * y[i])) }')
  echo "[ $v ] median $(median "$v")"
}
echo
echo "medians of $REPEATS runs; per-run values in brackets"
printf '%-11s %-14s %12s %12s %9s %14s\n' model impl "1-rank s/s" "2-rank s/s" scaling "vs torch 2-rk"
[ -z "$CSV" ] || echo "model,impl,one_rank,two_ranks,scaling,vs_torch" >"$CSV"
for model in $MODELS; do
  t2=$(m "$model/torch-ddp-2")
  impls="gz-ddp gz-horovod"
  [ "$model" = cnn ] || impls="$impls gz-ddp_stock"
  for impl in $impls torch-ddp dp; do
    if [ $impl = dp ]; then a=$(m "$model/gz-single-1"); b=$(m "$model/gz-dp-2"); else a=$(m "$model/$impl-1"); b=$(m "$model/$impl-2"); fi
    printf '%-11s %-14s %12s %12s %9s %14s\n' "$model" "${impl#gz-}" "$a" "$b" "$(scal "$b" "$a")" "$(ratio "$b" "$t2")"
    [ -z "$CSV" ] || echo "$model,${impl#gz-},$a,$b,$(scal "$b" "$a"),$(ratio "$b" "$t2")" >>"$CSV"
  done
  a=$(m "$model/gz-ddp-1"); b=$(m "$model/gz-ddp_nocomm-2")
  [ -z "$CSV" ] || echo "$model,ddp_nocomm,$a,$b,$(scal "$b" "$a"),$(ratio "$b" "$t2")" >>"$CSV"
  printf '%-11s %-14s %s\n' "$model" "" "ddp without the all-reduce (diagnostic, 2 ranks): $b samples/s = $(scal "$b" "$a") of 2 x ddp-1"
  a=$(m "$model/gz-single-1"); b=$(m "$model/gz-single-pair")
  [ -z "$CSV" ] || echo "$model,single_pair,$a,$b,$(scal "$b" "$a"),$(ratio "$b" "$t2")" >>"$CSV"
  printf '%-11s %-14s %s\n' "$model" "" "gz single (1 process, no DDP): $(m "$model/gz-single-1") [${res[$model/gz-single-1]} ]"
  printf '%-11s %-14s %s\n' "$model" "" "horovod/ddp (2 ranks): $(ratio "$(m "$model/gz-horovod-2")" "$(m "$model/gz-ddp-2")")"
  printf '%-11s %-14s %s\n' "$model" "" "ceiling: two single processes at once, no communication: $(m "$model/gz-single-pair") samples/s = $(scal "$(m "$model/gz-single-pair")" "$(m "$model/gz-single-1")") of 2 x single, $(scal "$(m "$model/gz-single-pair")" "$(m "$model/gz-ddp-1")") of 2 x ddp-1"
  printf '%-11s %-14s %s\n' "$model" "" "per round: ddp-2 / 2 x ddp-1 $(per_round "$model/gz-ddp-2" "$model/gz-ddp-1")"
  printf '%-11s %-14s %s\n' "$model" "" "per round: ddp_nocomm-2 / 2 x ddp-1 $(per_round "$model/gz-ddp_nocomm-2" "$model/gz-ddp-1")"
  printf '%-11s %-14s %s\n' "$model" "" "per round: single-pair / 2 x single $(per_round "$model/gz-single-pair" "$model/gz-single-1")"
  printf '%-11s %-14s %s\n' "$model" "" "per round: ddp-2 / ddp_nocomm-2 $(per_round "$model/gz-ddp-2" "$model/gz-ddp_nocomm-2" 1)"
  for k in "${!res[@]}"; do
    if [[ $k == $model/* ]]; then printf '%-11s   %-26s [%s ]\n' "$model" "${k#*/}" "${res[$k]}"; fi
  done | sort
done
echo "(targets: ddp scaling >= 0.97, ddp >= 1.2x torch, horovod within 5% of ddp; log: $log)"
