#!/usr/bin/env bash
# PyTorch's own DDP in Python, 2 ranks on one host, one thread each: backend "gz" vs Gloo vs the
# no-communication ceiling (the same script with a DDP comm hook that returns the bucket untouched),
# and guozhuang.torch's Horovod mode, for the cnn (batch 64) and bert-small (batch 8) models of
# `gz-bench train` (bench/ddp_bench.py). Every configuration runs REPEATS times, interleaved, so
# slow phases of a shared machine hit them alike; the table shows medians and per-round ratios.
#
#   flock /work/.bench.lock bench/run_python_bench.sh [BUILD_DIR]
#   env: REPEATS (5), CNN_STEPS (200), BERT_STEPS (20), WARMUP (5), MODELS ("cnn bert-small")
set -euo pipefail
BENCH_DECIMALS=2
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
py=/usr/bin/python3  # Debian's python3 has torch; the one on PATH may not
REPEATS=${REPEATS:-5}
CNN_STEPS=${CNN_STEPS:-200}
BERT_STEPS=${BERT_STEPS:-20}
WARMUP=${WARMUP:-5}
MODELS=${MODELS:-"cnn bert-small"}
[ -d "$build/python/guozhuang" ] || { echo "missing $build/python/guozhuang: build first (scripts/build.sh)" >&2; exit 1; }
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
log=$(mktemp -d)/python_bench.log
echo "log: $log" >&2
declare -A res
configs=("gloo:--backend gloo" "gz:--backend gz" "ceiling:--backend gz --hook noop" "horovod:--mode horovod")
for rep in $(seq 1 "$REPEATS"); do
  for model in $MODELS; do
    if [ "$model" = cnn ]; then batch=64; steps=$CNN_STEPS; else batch=8; steps=$BERT_STEPS; fi
    for c in "${configs[@]}"; do
      name=${c%%:*}
      args=${c#*:}
      echo "== round $rep $model $name: $args" >>"$log"
      # shellcheck disable=SC2086
      out=$(timeout 900 "$py" "$root/bench/ddp_bench.py" --model "$model" --nproc 2 --batch "$batch" \
            --steps "$steps" --warmup "$WARMUP" --threads 1 $args 2>&1) || true
      echo "$out" >>"$log"
      v=$(echo "$out" | sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' | tail -1)
      res[$model/$name]="${res[$model/$name]:-} ${v:-nan}"
      printf '  round %d %-11s %-8s %10s samples/s\n' "$rep" "$model" "$name" "${v:-nan}" >&2
    done
  done
done
# per_round A B: A's run i / B's run i for every round, then their median
per_round() {
  local v
  v=$(awk -v a="${res[$1]}" -v b="${res[$2]}" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; ++i) printf "%s%s", (i > 1 ? " " : ""), (x[i] == "nan" || y[i] == "nan" || y[i] == 0) ? "nan" : sprintf("%.3f", x[i] / y[i]) }')
  echo "median $(median "$v") [ $v ]"
}
echo
echo "samples/s, medians of $REPEATS interleaved rounds (2 ranks, 1 thread each); $(date -u +%FT%TZ); $(uptime)"
printf '%-11s %10s %10s %10s %10s\n' model gloo gz ceiling horovod
for model in $MODELS; do
  printf '%-11s %10s %10s %10s %10s\n' "$model" "$(median "${res[$model/gloo]}")" "$(median "${res[$model/gz]}")" \
    "$(median "${res[$model/ceiling]}")" "$(median "${res[$model/horovod]}")"
done
echo
for model in $MODELS; do
  echo "$model gz/ceiling      $(per_round "$model/gz" "$model/ceiling")   (target >= 0.95)"
  echo "$model gz/gloo         $(per_round "$model/gz" "$model/gloo")"
  echo "$model horovod/gz      $(per_round "$model/horovod" "$model/gz")   (target >= 0.95)"
  echo "$model gloo/ceiling    $(per_round "$model/gloo" "$model/ceiling")"
done
echo "(log: $log)"
