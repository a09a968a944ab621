#!/usr/bin/env bash
# ZeRO vs DDP on one host: MODEL (default bert-small), AdamW (gz::FusedAdamW), N ranks (default 4). Every round
# runs the stages of STAGES (default plain DDP, ZeRO stage 1 and stage 2; 3 = fully sharded) one
# after the other (interleaved, so slow phases of a noisy machine hit all alike; ratios are to the
# first stage listed) and records samples/s and the MEMORY lines of gz-bench train --memory:
# parameter, optimizer-state and gradient tensor bytes per rank, and the growth of the process's
# proportional set size (PSS: pages every rank maps, like shm buckets, count 1/ranks per rank) with
# its anonymous and shared-memory parts, and of RSS and peak RSS (over the timed steps) since the
# model and optimizer were built. Prints medians and the ratios to DDP.
#
#   flock /work/.bench.lock bench/run_zero_bench.sh [BUILD_DIR]
#   env: MODEL (bert-small; bert-base), RANKS (4), REPEATS (3), STEPS (12), WARMUP (3), BATCH (8), SEQ (128), CSV (also write there),
#        STAGES ("0 1 2")
set -euo pipefail
BENCH_DECIMALS=2
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
RANKS=${RANKS:-4}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-3}
BATCH=${BATCH:-8}
SEQ=${SEQ:-128}
CSV=${CSV:-}
STAGES=${STAGES:-0 1 2}
MODEL=${MODEL:-bert-small}
base=${STAGES%% *}
for f in "$gzrun" "$bench"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
log=$(mktemp -d)/zero_bench.log
echo "log: $log" >&2

declare -A sps state grad sg pss anon shmem rss peak param psg
# field NAME TEXT: value of NAME= on the MEMORY_MEAN line of TEXT
field() { echo "$2" | sed -n "s/.*MEMORY_MEAN .* $1=\(-\{0,1\}[0-9.]*\).*/\1/p" | tail -1; }
for rep in $(seq 1 "$REPEATS"); do
  for z in $STAGES; do
    out=$(timeout "${RUN_TIMEOUT:-600}" "$gzrun" --nproc-per-node "$RANKS" --master-port 0 -- "$bench" train \
      --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" --threads 1 \
      --zero "$z" --memory 2>&1) || { echo "$out" >>"$log"; echo "FAILED: zero=$z (see $log)" >&2; exit 1; }
    echo "== round $rep zero=$z" >>"$log"
    echo "$out" >>"$log"
    v=$(echo "$out" | sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' | tail -1)
    sps[$z]="${sps[$z]:-} $v"
    state[$z]=$(field state_mb "$out"); grad[$z]=$(field grad_mb "$out"); sg[$z]=$(field state_grad_mb "$out")
    param[$z]=$(field param_mb "$out"); psg[$z]=$(field param_state_grad_mb "$out")
    pss[$z]="${pss[$z]:-} $(field pss_delta_mb "$out")"; anon[$z]="${anon[$z]:-} $(field pss_anon_delta_mb "$out")"
    shmem[$z]="${shmem[$z]:-} $(field pss_shmem_delta_mb "$out")"; rss[$z]="${rss[$z]:-} $(field rss_delta_mb "$out")"
    peak[$z]="${peak[$z]:-} $(field peak_rss_delta_mb "$out")"
    printf '  round %d zero=%d: %s samples/s, state %s MiB, gradients %s MiB per rank\n' "$rep" "$z" "$v" \
      "${state[$z]}" "${grad[$z]}" >&2
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0 || a == "nan" || b == "nan") print "n/a"; else printf "%.3f", a / b }'; }
name() { [ "$1" = 0 ] && echo ddp || echo "zero-$1"; }
echo
echo "$MODEL, AdamW (FusedAdamW), $RANKS ranks x batch $BATCH, seq $SEQ, $STEPS timed steps; medians of $REPEATS rounds (per-rank means; vs = vs $(name "$base"))"
fmt='%-7s %10s %7s %10s %7s %9s %8s %7s %9s %9s %7s %9s %9s %9s %9s %9s\n'
printf "$fmt" impl samples/s vs state_MiB vs grad_MiB st+gr vs param_MiB p+st+gr vs pss_grow anon_pss shm_pss rss_grow peak_rss
[ -z "$CSV" ] || echo "impl,samples_per_s,throughput_vs_base,state_mib,state_vs_base,grad_mib,state_grad_mib,state_grad_vs_base,param_mib,param_state_grad_mib,param_state_grad_vs_base,pss_growth_mib,pss_anon_growth_mib,pss_shmem_growth_mib,rss_growth_mib,peak_rss_growth_mib" >"$CSV"
for z in $STAGES; do
  s=$(median "${sps[$z]}")
  row=("$(name $z)" "$s" "$(ratio "$s" "$(median "${sps[$base]}")")" "${state[$z]}" "$(ratio "${state[$z]}" "${state[$base]}")"
       "${grad[$z]}" "${sg[$z]}" "$(ratio "${sg[$z]}" "${sg[$base]}")" "${param[$z]}" "${psg[$z]}"
       "$(ratio "${psg[$z]}" "${psg[$base]}")" "$(median "${pss[$z]}")" "$(median "${anon[$z]}")"
       "$(median "${shmem[$z]}")" "$(median "${rss[$z]}")" "$(median "${peak[$z]}")")
  printf "$fmt" "${row[@]}"
  [ -z "$CSV" ] || (IFS=,; echo "${row[*]}") >>"$CSV"
done
for z in $STAGES; do echo "$(name $z) samples/s per round: [${sps[$z]} ]"; done
# Runs of one round are a minute apart: their ratios see less of the machine's slow phases.
for z in ${STAGES#"$base"}; do
  v=$(awk -v a="${sps[$z]}" -v b="${sps[$base]}" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; ++i) printf "%s%.3f", (i > 1 ? " " : ""), (y[i] > 0 ? x[i] / y[i] : 0) }')
  echo "$(name $z) / $(name "$base") per round: [ $v ] median $(median "$v")"
done
echo "(targets at 4 ranks: zero-1 state <= 0.3x ddp, zero-2 state+gradients <= 0.35x, samples/s >= 0.95x;"
echo " zero-3 parameters+state+gradients <= 0.30x ddp, samples/s >= 0.85x zero-2; log: $log)"
