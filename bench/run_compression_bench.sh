#!/usr/bin/env bash
# Gradient compression, local SGD and asynchronous model averaging against plain DDP across two
# simulated hosts (scripts/cluster.sh: 2 hosts x 1 rank) at shaped link rates, side by side in one run.
#
#   bench/run_compression_bench.sh throughput [BUILD_DIR]
#       bert-small (gz-bench train): samples/s, bytes per step handed to collectives (counted by the
#       hooks and averagers) and bytes per step host 0's NIC really sent (/proc/net/dev), per method
#       and link rate; REPEATS rounds interleaved, medians.
#   bench/run_compression_bench.sh accuracy [BUILD_DIR]
#       Fashion-MNIST (gz-train --config $FM_CONFIG): wall time and training time (evaluation
#       excluded) until the test accuracy first reaches TARGET, the step, final and best accuracy,
#       bytes per step (hook-counted, and host 0's NIC over the whole run), per method and link rate.
#
# env: RATES ("1gbit 200mbit"), METHODS ("ddp fp16 bf16 powersgd int8 topk local_sgd async"),
#      CLUSTER (cluster id, cp1), OUT (directory for PART.csv and the logs; default a temp dir),
#      REPEATS (throughput rounds, 2), BERT_STEPS (6), BERT_BATCH (8), BERT_WARMUP (2), SEQ (128),
#      FM_CONFIG (configs/fashion_mnist_2hosts.yaml), TARGET (0.91), FM_FLAGS (extra gz-train flags),
#      RUN_TIMEOUT (seconds per run, 900), and the methods' knobs: PSGD_RANK (4), PSGD_START (200),
#      TOPK_RATIO (0.01), H (local SGD period, 8), S (async staleness bound, 4), AVG_WARMUP (200).
# Hold the benchmark lock: flock /work/.bench.lock bench/run_compression_bench.sh ...
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"  # a session of its own at AUTOGROUP_NICE
part=${1:-}
[ "$part" = throughput ] || [ "$part" = accuracy ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
BENCH_DECIMALS=2
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${2:-${GZ_BUILD_DIR:-$root/build}}
build=$(cd "$build" && pwd)
gzrun=$build/tools/gzrun/gzrun
bench=$build/tools/gz-bench/gz-bench
train=$build/apps/gz-train/gz-train
cluster=$root/scripts/cluster.sh
py=/usr/bin/python3
RATES=${RATES:-"1gbit 200mbit"}
METHODS=${METHODS:-"ddp fp16 bf16 powersgd int8 topk local_sgd async"}
CLUSTER=${CLUSTER:-cp1}
REPEATS=${REPEATS:-2}
BERT_STEPS=${BERT_STEPS:-6}
BERT_BATCH=${BERT_BATCH:-8}
BERT_WARMUP=${BERT_WARMUP:-2}
SEQ=${SEQ:-128}
FM_CONFIG=${FM_CONFIG:-$root/configs/fashion_mnist_2hosts.yaml}
TARGET=${TARGET:-0.91}
FM_FLAGS=${FM_FLAGS:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
PSGD_RANK=${PSGD_RANK:-4}
PSGD_START=${PSGD_START:-200}
TOPK_RATIO=${TOPK_RATIO:-0.01}
H=${H:-8}
S=${S:-4}
AVG_WARMUP=${AVG_WARMUP:-200}
for f in "$gzrun" "$bench" "$train"; do
  [ -x "$f" ] || { echo "missing $f: build first (scripts/build.sh)" >&2; exit 1; }
done
"$cluster" check >/dev/null || exit $?
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log=$OUT/$part.log
: >"$log"
echo "results and logs: $OUT" >&2

C=("$cluster" -c "$CLUSTER")
cleanup() { "${C[@]}" down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up 2 >&2
master=$("${C[@]}" ip 0)
port=$((29700 + RANDOM % 200))  # a fresh port per job: no TIME_WAIT or late-peer crosstalk
# Two hosts: the rendezvous store is beyond loopback, so both nodes need the job's token.
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

# gz-train flags of a method (Fashion-MNIST).
train_flags() {
  case $1 in
    ddp) ;;
    fp16 | bf16 | int8) echo "--compression.method $1" ;;
    powersgd) echo "--compression.method powersgd --compression.rank $PSGD_RANK --compression.start_step $PSGD_START" ;;
    topk) echo "--compression.method topk --compression.topk_ratio $TOPK_RATIO" ;;
    local_sgd) echo "--averaging.method local_sgd --averaging.period $H --averaging.warmup_steps $AVG_WARMUP" ;;
    async) echo "--averaging.method async --averaging.max_staleness $S --averaging.warmup_steps $AVG_WARMUP" ;;
    *) echo "unknown method $1" >&2; exit 2 ;;
  esac
}
# gz-bench train flags of a method (bert-small; compression from the first timed step).
bench_flags() {
  case $1 in
    ddp) echo "--hook allreduce" ;;
    fp16 | bf16 | int8) echo "--hook $1" ;;
    powersgd) echo "--hook powersgd --powersgd-rank $PSGD_RANK" ;;
    topk) echo "--hook topk --topk-ratio $TOPK_RATIO" ;;
    local_sgd) echo "--averaging local_sgd --period $H" ;;
    async) echo "--averaging async --staleness $S" ;;
    *) echo "unknown method $1" >&2; exit 2 ;;
  esac
}
nic_tx() {  # bytes host $1's NIC has sent so far
  "${C[@]}" run "$1" cat /proc/net/dev | awk -F'[: ]+' 'NR > 2 && $2 != "lo" { s += $11 } END { printf "%.0f\n", s }'
}
set_rate() { for h in 0 1; do "${C[@]}" rate "$h" "$1" >/dev/null; done; }
# on_both NAME CMD...: CMD on host 0 and host 1 at once ({RANK} becomes the host index); outputs in
# $OUT/NAME.h0 / .h1. Returns nonzero if either failed.
on_both() {
  local name=$1 i ok=0 pids=()
  shift
  echo "== $name: $*" >>"$log"
  for i in 0 1; do
    local args=("${@//\{RANK\}/$i}")
    "${C[@]}" run "$i" timeout "$RUN_TIMEOUT" "${args[@]}" >"$OUT/$name.h$i" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do wait "${pids[$i]}" || ok=1; done
  for i in 0 1; do { echo "-- host $i"; tail -n 30 "$OUT/$name.h$i"; } >>"$log"; done
  return $ok
}
launch() {  # gzrun on both hosts, 1 rank each, on port $port; the rest is the command
  echo env -u GZ_NODE_ID "$gzrun" --nnodes 2 --node-rank "{RANK}" --master-addr "$master" --master-port "$port" \
    --nproc-per-node 1 --rdzv-timeout 60 --
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) CPUs; commit $(git -C "$root" rev-parse --short HEAD)" | tee -a "$log" >&2
echo "uptime at start: $(uptime)" | tee -a "$log" >&2

if [ "$part" = throughput ]; then
  declare -A sps bytes wire
  for rep in $(seq 1 "$REPEATS"); do
    for rate in $RATES; do
      set_rate "$rate"
      for m in $METHODS; do
        name=bert_${rate}_${m}_r$rep
        port=$((port + 2))  # gzrun's store takes MASTER_PORT+1
        read -r -a lf <<<"$(launch)"
        read -r -a mf <<<"$(bench_flags "$m")"
        if on_both "$name" "${lf[@]}" "$bench" train --model bert-small --mode ddp --batch "$BERT_BATCH" \
          --steps "$BERT_STEPS" --warmup "$BERT_WARMUP" --threads 1 --seq "$SEQ" "${mf[@]}"; then
          line=$(grep -h 'RESULT ' "$OUT/$name.h0" | tail -1)
          v=$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
          b=$(sed -n 's/.* bytes_per_step=\([0-9]*\).*/\1/p' <<<"$line")
          w=$(sed -n 's/.*wire_bytes_per_step=\([0-9]*\).*/\1/p' <<<"$line")
        else
          v=nan b=nan w=nan
          echo "FAILED: $name (see $log)" >&2
        fi
        sps[$rate/$m]="${sps[$rate/$m]:-} $v"
        bytes[$rate/$m]=$b
        wire[$rate/$m]=$w
        printf '  round %d %-8s %-10s %8s samples/s  %12s B/step (hooks)  %12s B/step (NIC)  %s\n' "$rep" "$rate" "$m" \
          "$v" "$b" "$w" "$(uptime | sed 's/.*load/load/')" >&2
      done
    done
  done
  csv=$OUT/throughput.csv
  echo "link,method,samples_per_s,runs,bytes_per_step,nic_bytes_per_step,vs_ddp" >"$csv"
  for rate in $RATES; do
    base=$(median "${sps[$rate/ddp]:-}")
    for m in $METHODS; do
      med=$(median "${sps[$rate/$m]}")
      rel=$(awk -v a="$med" -v b="$base" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "n/a"; else printf "%.2f", a / b }')
      echo "$rate,$m,$med,$(echo ${sps[$rate/$m]} | tr ' ' '/'),${bytes[$rate/$m]},${wire[$rate/$m]},$rel" >>"$csv"
    done
  done
else
  csv=$OUT/accuracy.csv
  echo "link,method,reached,wall_s_to_target,train_s_to_target,step_at_target,final_accuracy,best_accuracy,train_s_total,steps,bytes_per_step,nic_bytes_per_step" >"$csv"
  for rate in $RATES; do
    set_rate "$rate"
    for m in $METHODS; do
      name=fmnist_${rate}_${m}
      dir=$OUT/$name
      rm -rf "$dir.0" "$dir.1"
      port=$((port + 2))  # gzrun's store takes MASTER_PORT+1
      read -r -a lf <<<"$(launch)"
      read -r -a mf <<<"$(train_flags "$m")"
      read -r -a xf <<<"$FM_FLAGS"
      tx0=$(nic_tx 0)
      if ! on_both "$name" "${lf[@]}" "$train" --config "$FM_CONFIG" --work_dir "$dir.{RANK}" "${mf[@]}" "${xf[@]}"; then
        echo "FAILED: $name (see $log)" >&2
      fi
      tx1=$(nic_tx 0)
      row=$("$py" - "$dir.0/history.jsonl" "$TARGET" "$tx0" "$tx1" <<'EOF'
import json, sys
path, target, tx0, tx1 = sys.argv[1], float(sys.argv[2]), int(float(sys.argv[3])), int(float(sys.argv[4]))
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except OSError:
    rows = []
ev = [r for r in rows if r.get("kind") == "eval" and r.get("test_accuracy") is not None]
if not ev:
    print("no,nan,nan,nan,nan,nan,nan,nan,nan,nan"); sys.exit()
hit = next((r for r in ev if r["test_accuracy"] >= target), None)
last = ev[-1]
train_s = lambda r: r["time"] - r.get("eval_seconds", 0.0)
fields = ["yes" if hit else "no",
          f"{hit['time']:.1f}" if hit else "nan", f"{train_s(hit):.1f}" if hit else "nan",
          str(hit["step"]) if hit else "nan",
          f"{last['test_accuracy']:.4f}", f"{max(r['test_accuracy'] for r in ev):.4f}",
          f"{train_s(last):.1f}", str(last["step"]),
          f"{last.get('comm_bytes_per_step', float('nan')):.0f}", f"{(tx1 - tx0) / max(1, last['step']):.0f}"]
print(",".join(fields))
EOF
)
      echo "$rate,$m,$row" >>"$csv"
      echo "  $rate $m: $row  ($(uptime | sed 's/.*load/load/'))" >&2
    done
  done
fi
echo "uptime at end: $(uptime)" | tee -a "$log" >&2
column -s, -t <"$csv"
echo "csv: $csv"
