#!/usr/bin/env bash
# ZeRO stage 3 across two simulated hosts (scripts/cluster.sh, 1 rank each, every host's NIC shaped
# to RATE with tbf): what prefetching the next unit's all-gather buys when the link, not the
# cores, is the bottleneck. Per round, interleaved (a noisy machine hits every configuration alike):
#   zero2         gz-bench train --mode ddp --zero 2
#   zero3         --zero 3 (fully_shard units, prefetch on: the default)
#   zero3-nopf    --zero 3 --no-prefetch (every unit's gather waits until the unit is needed)
# Prints medians and per-round ratios zero3 / zero3-nopf and zero3 / zero2.
#
#   bench/run_zero3_multihost.sh [BUILD_DIR]
#   env: REPEATS (3), RATE (1gbit), MODEL (bert-small), BATCH (8), SEQ (128), STEPS (8),
#        WARMUP (2), RUN_TIMEOUT (400 s per run), CSV (write the medians there too),
#        AUTOGROUP_NICE (-20)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"  # a session of its own at AUTOGROUP_NICE
BENCH_DECIMALS=2
. "$(dirname "$0")/lib/stats.sh"  # median, ratios
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
build=$(cd "$build" && pwd)
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
cluster=$root/scripts/cluster.sh
REPEATS=${REPEATS:-3}
RATE=${RATE:-1gbit}
MODEL=${MODEL:-bert-small}
BATCH=${BATCH:-8}
SEQ=${SEQ:-128}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-400}
CSV=${CSV:-}
for f in "$gzrun" "$bench"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
help=$("$bench" train --help 2>&1 || true)  # not piped into grep -q: pipefail and SIGPIPE
grep -q -- --no-prefetch <<<"$help" || { echo "$bench has no --no-prefetch: rebuild gz-bench" >&2; exit 1; }
"$cluster" check >/dev/null || exit $?
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

id=z3$$
C=("$cluster" -c "$id")
work=$(mktemp -d)
log=$work/zero3_multihost.log
echo "log: $log" >&2
cleanup() { "${C[@]}" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up 2 --rate "$RATE" >&2
master=$("${C[@]}" ip 0)
port=29700  # a fresh port per job: no TIME_WAIT crosstalk between runs

declare -A res
# run NAME ARGS...: the 2-host job (gzrun on each host, 1 rank each); samples/s from rank 0.
run() {
  local name=$1; shift
  local i pids=() ok=1 v
  port=$((port + 1))
  echo "== $name: $*" >>"$log"
  for i in 0 1; do
    "${C[@]}" run "$i" timeout "$RUN_TIMEOUT" env -u GZ_NODE_ID "$gzrun" --nnodes 2 --node-rank "$i" \
      --master-addr "$master" --master-port "$port" --nproc-per-node 1 --rdzv-timeout 60 -- \
      "$bench" train --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" \
      --threads 1 --mode ddp "$@" >"$work/h$i.out" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || ok=0; done
  for i in 0 1; do { echo "-- host $i"; cat "$work/h$i.out"; } >>"$log"; done
  v=$(sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' "$work/h0.out" | tail -1)
  { [ $ok = 1 ] && [ -n "$v" ]; } || { echo "FAILED: $name (see $log)" >&2; v=nan; }
  res[$name]="${res[$name]:-} $v"
  printf '  %-12s %10s samples/s\n' "$name" "$v" >&2
}

echo "uptime at start: $(uptime)" >&2
for rep in $(seq 1 "$REPEATS"); do
  echo "round $rep/$REPEATS, $MODEL at $RATE, $(uptime | sed 's/.*load/load/')" >&2
  run zero2 --zero 2
  run zero3 --zero 3
  run zero3-nopf --zero 3 --no-prefetch
done
echo "uptime at end: $(uptime)" >&2

# per_round A B: A's run i / B's run i for every round (ratios, bench/lib/stats.sh), then their median.
per_round() {
  local v
  v=$(ratios "${res[$1]:-}" "${res[$2]:-}")
  echo "median $(median "$v") [ $v ]"
}
echo
echo "2 hosts x 1 rank, $MODEL, batch $BATCH x seq $SEQ per rank, link $RATE; samples/s, medians of $REPEATS rounds"
for n in zero2 zero3 zero3-nopf; do printf '  %-12s %8s   [%s ]\n' "$n" "$(median "${res[$n]}")" "${res[$n]}"; done
echo "per-round ratios:"
echo "  zero3 / zero3-nopf (prefetch on / off): $(per_round zero3 zero3-nopf)"
echo "  zero3 / zero2:                          $(per_round zero3 zero2)"
echo "  zero3-nopf / zero2:                     $(per_round zero3-nopf zero2)"
[ -z "$CSV" ] || {
  echo "model,rate,zero2,zero3,zero3_nopf" >"$CSV"
  echo "$MODEL,$RATE,$(median "${res[zero2]}"),$(median "${res[zero3]}"),$(median "${res[zero3-nopf]}")" >>"$CSV"
}
