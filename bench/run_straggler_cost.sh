#!/usr/bin/env bash
# What the straggler report costs in training: gz-train with the report on (every 10 steps, the
# default) against off (GZ_STRAGGLER_EVERY=0), 2 ranks on one machine (DDP over shm), for the cnn
# (synthetic 28x28 images) and bert_small (generated text lines), in interleaved rounds (the order
# of on and off alternates per round) so slow phases of a shared machine hit both alike.
# Throughput = optimizer steps per second between the history rows of step 10 and of the last
# step (set-up, the first steps and the final evaluation left out). Also prints what the report
# measured of itself (its exchanges' share of rank 0's training time, from its summary line).
# The phase marks are always on (no switch): they are part of both columns.
#
#   bench/run_straggler_cost.sh [BUILD_DIR]
#   env: ROUNDS (5), MODELS ("cnn bert_small"), CNN_STEPS (600), BERT_STEPS (60)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
ROUNDS=${ROUNDS:-5}
MODELS=${MODELS:-"cnn bert_small"}
CNN_STEPS=${CNN_STEPS:-600}
BERT_STEPS=${BERT_STEPS:-60}
gzrun=$build/tools/gzrun/gzrun
train=$build/apps/gz-train/gz-train
for f in "$gzrun" "$train"; do [ -x "$f" ] || { echo "missing $f: build first" >&2; exit 1; }; done
export OMP_NUM_THREADS=1
work=$(mktemp -d)
log=$work/cost.log
echo "log: $log (load at start: $(cut -d' ' -f1-3 /proc/loadavg))" >&2

text_lines "$work/text"  # bert_small's data

args_of() {  # MODEL -> gz-train flags
  case $1 in
    cnn) echo "--dataset synthetic --train_data 50000 --test_data 64 --net_type cnn --batch_size 32 --max_steps $CNN_STEPS" ;;
    bert_small) echo "--dataset text_lines --train_data $work/text --test_data $work/text --net_type bert_small \
      --input_size 64 --num_classes 4 --batch_size 8 --max_steps $BERT_STEPS --eval_batch_size 64 --test_limit 64" ;;
  esac
}

# run MODEL on|off -> prints "steps_per_s report_pct"
run() {
  local model=$1 mode=$2 dir every
  dir=$work/$model-$mode-$RANDOM
  every=$([ "$mode" = on ] && echo 10 || echo 0)
  # shellcheck disable=SC2046
  GZ_STRAGGLER_EVERY=$every "$gzrun" --nproc-per-node 2 -- "$train" $(args_of "$model") --mode ddp \
    --num_workers 1 --num_threads 1 --progress false --tensorboard true --log_every 10 --save_steps 100000 \
    --work_dir "$dir" >"$dir.out" 2>&1 || { echo "nan nan"; cat "$dir.out" >>"$log"; return; }
  cat "$dir.out" >>"$log"
  python3 - "$dir/history.jsonl" "$dir.out" <<'EOF'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if r["kind"] == "train"]
a = next(r for r in train if r["step"] == 10)
b = train[-1]
sps = (b["step"] - a["step"]) / (b["time"] - a["time"])
m = re.search(r"\(([0-9.]+)% of [0-9.]+ s of training on rank 0\)", open(sys.argv[2]).read())
print("%.4f %s" % (sps, m.group(1) if m else "-"))
EOF
}

declare -A sps pct
for ((r = 1; r <= ROUNDS; ++r)); do
  for model in $MODELS; do
    order="on off"
    [ $((r % 2)) = 0 ] && order="off on"
    for mode in $order; do
      read -r s p < <(run "$model" "$mode")
      sps[$model/$mode]="${sps[$model/$mode]:-} $s"
      [ "$mode" = on ] && pct[$model]="${pct[$model]:-} $p"
      printf 'round %d %-10s report %-3s %8s steps/s  report itself %s%%\n' "$r" "$model" "$mode" "$s" "$p" >&2
    done
  done
done

echo
echo "| model | steps/s off | steps/s on | on/off per round | median on/off | report's own share of rank 0's time |"
echo "|---|---|---|---|---|---|"
for model in $MODELS; do
  ratios=$(awk -v a="${sps[$model/on]}" -v b="${sps[$model/off]}" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; ++i) printf "%s%.3f", (i > 1 ? " " : ""), x[i] / y[i] }')
  echo "| $model | $(median "${sps[$model/off]}") | $(median "${sps[$model/on]}") | $ratios | $(median "$ratios") |" \
    "$(echo ${pct[$model]}) % |"
done
echo "(load at end: $(cut -d' ' -f1-3 /proc/loadavg); rounds: $ROUNDS; log $log)"
