#!/usr/bin/env bash
# bert-base (12 layers, hidden 768, 12 heads, FFN 3072, seq SEQ; ~110 M parameters) with 2 ranks:
# gz DP (2 replicas in threads of one process), gz DDP, gz Horovod mode and PyTorch 1.13 DDP over
# gloo, on one simulated host (2 ranks) and on 2 simulated hosts x 1 rank (scripts/cluster.sh,
# unshaped veth), plus the single-process baseline. Interleaved over REPEATS rounds; medians.
# bert-base is slow on a 2-core machine: small batches and a handful of steps (see the defaults).
# gz DDP and Horovod mode exchange the token embedding's gradient as rows (the default); PyTorch DDP
# runs twice: dense, and with nn.Embedding(sparse=True) ("torch-sparse", the same advantage).
# The script runs in a session of its own with autogroup nice AUTOGROUP_NICE (default -20, "off"
# leaves it alone): see bench/run_multihost_train.sh.
#
#   bench/run_bert_base.sh [BUILD_DIR]
#   env: REPEATS (2), BATCH (4 per rank), STEPS (3), WARMUP (1), SEQ (128), RUN_TIMEOUT (600 s),
#        CSV (write the medians there too), AUTOGROUP_NICE (-20)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"  # a session of its own at AUTOGROUP_NICE
BENCH_DECIMALS=2
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
build=$(cd "$build" && pwd)
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
cluster=$root/scripts/cluster.sh
py=/usr/bin/python3
REPEATS=${REPEATS:-2}
BATCH=${BATCH:-4}
STEPS=${STEPS:-3}
WARMUP=${WARMUP:-1}
SEQ=${SEQ:-128}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
CSV=${CSV:-}
for f in "$gzrun" "$bench"; do [ -x "$f" ] || { echo "missing $f: build first" >&2; exit 1; }; done
"$cluster" check >/dev/null || exit $?
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
id=bb$$
# Several hosts: the rendezvous store is beyond loopback, so every node needs the job's token.
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
C=("$cluster" -c "$id")
work=$(mktemp -d)
log=$work/bert_base.log
echo "log: $log" >&2
trap '"${C[@]}" down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up 2 >&2
master=$("${C[@]}" ip 0)
port=29700
common=(--model bert-base --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" --threads 1 --seq "$SEQ")

result_of() { sed -n 's/.*RESULT .*samples_per_s=\([0-9.]*\).*/\1/p' "$1" | tail -1; }
declare -A res
record() { res[$1]="${res[$1]:-} $2"; printf '  %-22s %10s samples/s\n' "$1" "$2" >&2; }
# hosts NAME N CMD...: CMD on hosts 0..N-1 at once ({RANK} = host index); samples/s from host 0.
hosts() {
  local name=$1 n=$2; shift 2
  local i pids=() ok=1 v
  echo "== $name: $*" >>"$log"
  for ((i = 0; i < n; ++i)); do
    local args=("${@//\{RANK\}/$i}")
    "${C[@]}" run "$i" timeout "$RUN_TIMEOUT" "${args[@]}" >"$work/h$i.out" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; ++i)); do wait "${pids[$i]}" || ok=0; done
  for ((i = 0; i < n; ++i)); do { echo "-- host $i"; cat "$work/h$i.out"; } >>"$log"; done
  v=$(result_of "$work/h0.out")
  { [ $ok = 1 ] && [ -n "$v" ]; } || { echo "FAILED: $name (see $log)" >&2; v=nan; }
  record "$name" "$v"
}

echo "uptime at start: $(uptime)" >&2
for rep in $(seq 1 "$REPEATS"); do
  echo "round $rep/$REPEATS, $(uptime | sed 's/.*load/load/')" >&2
  hosts single 1 "$bench" train "${common[@]}" --mode single
  hosts 1host/gz-dp 1 "$bench" train "${common[@]}" --mode dp
  for mode in ddp horovod; do
    hosts "1host/gz-$mode" 1 "$gzrun" --nproc-per-node 2 --master-port 0 -- "$bench" train "${common[@]}" --mode "$mode"
  done
  hosts 1host/torch-ddp 1 "$py" "$root/bench/ddp_bench.py" --nproc 2 "${common[@]}"
  hosts 1host/torch-sparse 1 "$py" "$root/bench/ddp_bench.py" --nproc 2 "${common[@]}" --sparse-embedding
  for mode in ddp horovod; do
    port=$((port + 1))
    hosts "2hosts/gz-$mode" 2 env -u GZ_NODE_ID "$gzrun" --nnodes 2 --node-rank "{RANK}" --master-addr "$master" \
      --master-port "$port" --nproc-per-node 1 --rdzv-timeout 120 -- "$bench" train "${common[@]}" --mode "$mode"
  done
  for t in torch-ddp torch-sparse; do
    port=$((port + 1))
    extra=()
    [ "$t" = torch-sparse ] && extra=(--sparse-embedding)
    hosts "2hosts/$t" 2 env RANK="{RANK}" WORLD_SIZE=2 MASTER_ADDR="$master" MASTER_PORT="$port" \
      "$py" "$root/bench/ddp_bench.py" --env "${common[@]}" "${extra[@]}"
  done
done
echo "uptime at end: $(uptime)" >&2

m() { median "${res[$1]:-}"; }
echo
echo "bert-base, batch $BATCH per rank, seq $SEQ, $STEPS timed steps after $WARMUP; medians of $REPEATS rounds"
printf '%-8s %-12s %10s %14s %11s %11s\n' where impl samples/s "s/1000 smp" "vs torch" "vs 2xsingle"
[ -z "$CSV" ] || echo "where,impl,samples_per_s,s_per_1000,vs_torch,vs_2x_single" >"$CSV"
s=$(m single)
printf '%-8s %-12s %10s %14s %11s %11s\n' 1proc single "$s" "$(awk -v v="$s" 'BEGIN { printf (v == "nan" || v == 0) ? "n/a" : "%.0f", 1000 / v }')" - -
[ -z "$CSV" ] || echo "1proc,single,$s,$(awk -v v="$s" 'BEGIN { printf (v == "nan" || v == 0) ? "n/a" : "%.0f", 1000 / v }'),," >>"$CSV"
for where in 1host 2hosts; do
  t=$(m "$where/torch-ddp")
  for impl in gz-dp gz-ddp gz-horovod torch-ddp torch-sparse; do
    [ -n "${res[$where/$impl]:-}" ] || continue
    v=$(m "$where/$impl")
    per=$(awk -v v="$v" 'BEGIN { printf (v == "nan" || v == 0) ? "n/a" : "%.0f", 1000 / v }')
    vt=$(awk -v a="$v" -v b="$t" 'BEGIN { printf (a == "nan" || b == "nan" || b == 0) ? "n/a" : "%.3f", a / b }')
    vs=$(awk -v a="$v" -v b="$s" 'BEGIN { printf (a == "nan" || b == "nan" || b == 0) ? "n/a" : "%.3f", a / (2 * b) }')
    printf '%-8s %-12s %10s %14s %11s %11s\n' "$where" "$impl" "$v" "$per" "$vt" "$vs"
    [ -z "$CSV" ] || echo "$where,$impl,$v,$per,$vt,$vs" >>"$CSV"
  done
done
echo
for k in "${!res[@]}"; do printf '  %-22s [%s ]\n' "$k" "${res[$k]}"; done | sort
echo "(gz DP runs in one process and cannot span hosts: no 2hosts row; log: $log)"
