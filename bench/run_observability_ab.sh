#!/usr/bin/env bash
# What the flight recorder and the straggler report cost in training (issue 21: throughput with
# both on >= 0.995 of both off), measured A/B inside each run: gz-train with GZ_OBS_AB_WINDOW=W
# alternates windows of W steps between ON (the defaults: a recorder in every communicator, the
# straggler report every 10 steps) and OFF (every recorder paused, the report not called) and
# prints both windows' steps/s (src/train/straggler/observability_ab.h). Separate runs of the same
# settings differ by up to 10 % on this VM (benchmarks.md); the windows of one run share its vCPU
# placement and neighbours. Each round also runs the CONTROL (GZ_OBS_AB_CONTROL=1: the same
# windows, nothing switched): what the method reports when there is nothing to find.
# gz-train under gzrun --nproc-per-node 2 (DDP over shm, 1 thread per rank), the cnn of
# configs/fashion_mnist.yaml and bert_small on generated text lines.
#
#   flock /work/.bench.lock bench/run_observability_ab.sh [BUILD_DIR]
#   env: ROUNDS (3), MODELS ("cnn bert_small"), WINDOW (20: a multiple of the report's every=10, so
#        ON windows exchange as often as a plain run), CNN_STEPS (1000), BERT_STEPS (240), KEEP (dir)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
. "$(dirname "$0")/lib/observability.sh"  # args_of
. "$(dirname "$0")/lib/stats.sh"  # median, span, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
ROUNDS=${ROUNDS:-3}
MODELS=${MODELS:-"cnn bert_small"}
WINDOW=${WINDOW:-20}
CNN_STEPS=${CNN_STEPS:-1000}
BERT_STEPS=${BERT_STEPS:-240}
gzrun=$build/tools/gzrun/gzrun
train=$build/apps/gz-train/gz-train
for f in "$gzrun" "$train"; do [ -x "$f" ] || { echo "missing $f: build first" >&2; exit 1; }; done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
unset GZ_FLIGHT_RECORDER GZ_STRAGGLER_EVERY  # ON means the defaults
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
echo "runs: $work; build: $build ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')); window $WINDOW steps"
echo "start: $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
text_lines "$work/text"


# run MODEL MODE (ab|control) -> prints the run's on/off ratio ("nan" when it failed)
run() {
  local model=$1 mode=$2 out ctl=0
  out=$work/$model-$mode-r$r.out
  [ "$mode" = control ] && ctl=1
  # shellcheck disable=SC2046
  if ! GZ_OBS_AB_WINDOW=$WINDOW GZ_OBS_AB_CONTROL=$ctl timeout 900 "$gzrun" --nproc-per-node 2 --master-port 0 -- \
    "$train" $(args_of "$model") --progress false --log_every 10 --save_steps 100000 --eval_steps 100000 \
    --work_dir "$work/$model-$mode-r$r" >"$out" 2>&1; then
    echo nan
    return
  fi
  grep -o 'on/off [0-9.]*' "$out" | tail -1 | cut -d' ' -f2
}

declare -A ratio
for ((r = 1; r <= ROUNDS; ++r)); do
  for model in $MODELS; do
    order="ab control"
    [ $((r % 2)) = 0 ] && order="control ab"
    for mode in $order; do
      q=$(run "$model" "$mode")
      ratio[$model/$mode]="${ratio[$model/$mode]:-} $q"
      printf 'round %d %-10s %-7s on/off %s  load %s  %s\n' "$r" "$model" "$mode" "$q" \
        "$(cut -d' ' -f1 /proc/loadavg)" "$(grep -o 'obs A/B.*' "$work/$model-$mode-r$r.out" | tail -1)"
    done
  done
done
echo
echo "end: $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | ON/OFF per run | ON/OFF median | range | control per run | control median | control range |"
echo "|---|---|---:|---|---|---:|---|"
for model in $MODELS; do
  a=${ratio[$model/ab]} c=${ratio[$model/control]}
  echo "| $model |$a | **$(median "$a")** | $(span "$a") |$c | $(median "$c") | $(span "$c") |"
done
