#!/usr/bin/env bash
# What the flight recorder and the straggler report cost in training (issue 21: throughput with
# both on >= 0.995 of both off). gz-train under gzrun --nproc-per-node 2 (DDP over shm), for the
# cnn of configs/fashion_mnist.yaml (the main job) and bert_small (generated text lines).
#   ON   the defaults: flight recorder in every communicator, straggler report every 10 steps
#   OFF  GZ_FLIGHT_RECORDER=0 GZ_STRAGGLER_EVERY=0
#   OFF2 OFF again: the control, what the method reports when there is nothing to find
# Each round runs, per model, ON OFF OFF2 and the next round OFF2 OFF ON (ON and OFF2 are always
# next to OFF, so ON/OFF and OFF2/OFF see the machine alike); slow phases of a shared machine hit
# all three. Throughput = optimizer steps/s between the history rows of step WARMUP and of the
# last step (set-up, the first steps and the final evaluation left out). The phase marks are
# always on (no switch): they are part of every column. An ON run also prints what the report
# measured of itself (its summary's "the report itself" line).
#
#   flock /work/.bench.lock bench/run_observability_cost.sh [BUILD_DIR]   (about 15 min at load 20-37)
#   env: ROUNDS (8), MODELS ("cnn bert_small"), CNN_STEPS (500), BERT_STEPS (100), WARMUP (10),
#        KEEP (a directory: keep every run's output and history there)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
. "$(dirname "$0")/lib/observability.sh"  # args_of
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
ROUNDS=${ROUNDS:-8}
MODELS=${MODELS:-"cnn bert_small"}
CNN_STEPS=${CNN_STEPS:-500}
BERT_STEPS=${BERT_STEPS:-100}
WARMUP=${WARMUP:-10}
gzrun=$build/tools/gzrun/gzrun
train=$build/apps/gz-train/gz-train
for f in "$gzrun" "$train"; do [ -x "$f" ] || { echo "missing $f: build first" >&2; exit 1; }; done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset GZ_FLIGHT_RECORDER GZ_STRAGGLER_EVERY  # ON means the defaults
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
echo "runs: $work; build: $build ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "start: $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"

text_lines "$work/text"  # bert_small's data


# run MODEL MODE -> prints "steps_per_s" ("nan" when the run failed); keeps its output in $dir.out
run() {
  local model=$1 mode=$2 dir env=()
  dir=$work/$model-$mode-r$r
  rm -rf "$dir"
  [ "$mode" = on ] || env=(GZ_FLIGHT_RECORDER=0 GZ_STRAGGLER_EVERY=0)
  # shellcheck disable=SC2046
  if ! env "${env[@]}" timeout 600 "$gzrun" --nproc-per-node 2 --master-port 0 -- "$train" $(args_of "$model") \
    --progress false --tensorboard true --log_every 10 --save_steps 100000 --eval_steps 100000 --work_dir "$dir" >"$dir.out" 2>&1; then
    echo nan
    return
  fi
  history_steps_per_s "$dir/history.jsonl" "$WARMUP"
}

# The report's own cost line of an ON run; and a check that OFF really is off.
own_cost() { grep -o 'the report itself: .*' "$1" | tail -1 || echo "(no summary: the report did not run!)"; }

declare -A sps
loads=""
for ((r = 1; r <= ROUNDS; ++r)); do
  loads="$loads $(cut -d' ' -f1 /proc/loadavg)"
  for model in $MODELS; do
    order="on off off2"
    [ $((r % 2)) = 0 ] && order="off2 off on"
    for mode in $order; do
      s=$(run "$model" "$mode")
      sps[$model/$mode]="${sps[$model/$mode]:-} $s"
      extra=""
      if [ "$mode" = on ]; then
        extra=$(own_cost "$work/$model-$mode-r$r.out")
      elif grep -q 'the report itself' "$work/$model-$mode-r$r.out"; then
        echo "error: the straggler report ran in an OFF run ($work/$model-$mode-r$r.out)" >&2
        exit 1
      fi
      [ "$s" = nan ] && extra="FAILED: $work/$model-$mode-r$r.out"
      printf 'round %d %-10s %-4s %9s steps/s  load %s  %s\n' "$r" "$model" "$mode" "$s" \
        "$(cut -d' ' -f1 /proc/loadavg)" "$extra"
    done
  done
done
loads="$loads $(cut -d' ' -f1 /proc/loadavg)"


echo
echo "end: $(date -u '+%F %T') UTC; 1-min load at each round's start and at the end:$loads"
echo "(per-round ratios in round order; ON and OFF2 each divided by the OFF of their round)"
echo
echo "| model | steps/s OFF (median) | steps/s ON (median) | ON/OFF per round | ON/OFF median | ON/OFF range | control OFF2/OFF per round | control median | control range |"
echo "|---|---:|---:|---|---:|---|---|---:|---|"
for model in $MODELS; do
  on=$(ratios "${sps[$model/on]}" "${sps[$model/off]}")
  ctl=$(ratios "${sps[$model/off2]}" "${sps[$model/off]}")
  echo "| $model | $(median "${sps[$model/off]}") | $(median "${sps[$model/on]}") | $on | **$(median "$on")** |" \
    "$(span "$on") | $ctl | $(median "$ctl") | $(span "$ctl") |"
done
echo
for model in $MODELS; do  # one ON run's end summary per model (rank 0, gzrun's "[0] " prefix)
  echo "$model, round $ROUNDS, ON: the straggler report's summary:"
  sed -n '/straggler report: /,/the report itself/p' "$work/$model-on-r$ROUNDS.out"
done
