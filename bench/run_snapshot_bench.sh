#!/usr/bin/env bash
# In-memory snapshots (issue 22): what a SIGKILLed worker costs with and without them, and what
# taking one every step costs. gz-train under gzrun --nproc-per-node 2 (DDP over shm), for the cnn
# of configs/fashion_mnist.yaml and bert_small (generated text lines).
#
# recovery  per model: an uninterrupted run (REF), then rank 1 SIGKILLed as step KILL begins
#           (gzrun --max-restarts 1 restarts both ranks): DISK restarts from the disk checkpoint
#           (cnn: the config's one per epoch; bert_small: every BERT_SAVE steps), SNAP with
#           snapshot_every 1, IN-PLACE the same under gzrun --recovery in-place (only rank 1 is
#           restarted; rank 0 recovers in its process), SREF = snapshot_every 1 without a kill.
#           Seconds lost = the run's wall time - REF's (DISK) or SREF's (SNAP, IN-PLACE: the
#           snapshots' own cost apart); steps
#           redone from the sample audit (tests/train/check_sample_log.py).
# cost      per model, ROUNDS rounds of ON (snapshot_every 1), OFF, OFF2 (OFF again: the control),
#           with OLD_TRAIN also OLD (that gz-train, e.g. one built before a change, snapshot_every
#           1), with CAPTURES2=1 also ON2 (GZ_SNAPSHOT_CAPTURES=2), and ON0 (GZ_DEFER_STATE_COPY=0:
#           the copy on the training thread); order reversed every other
#           round; throughput = steps/s between the history rows of step WARMUP and the last
#           step; the training thread's ms per snapshot from gz-train's "snapshots:" line.
# ckpt      disk checkpoints (async_checkpoint): per model, ROUNDS rounds of SYNC (written on the
#           training thread), ASYNC (copied alongside the next step, written in the background),
#           ASYNC0 (GZ_DEFER_STATE_COPY=0: copied on the training thread) and NONE (no checkpoints:
#           the step time), a checkpoint every CNN_SAVE / BERT_CKPT_SAVE steps, order reversed
#           every other round; the training thread's ms per save from gz-train's "checkpoints:"
#           line (rank 0; rank 1 waits for it), as a share of NONE's step.
#
#   flock /work/.bench.lock bench/run_snapshot_bench.sh [BUILD_DIR]
#   env: PARTS ("recovery cost"), MODELS ("cnn bert_small"), ROUNDS (4), CNN_STEPS (300),
#        BERT_STEPS (60), WARMUP (10), CNN_KILL (307, of 468 steps), BERT_KILL (70 of 100),
#        BERT_SAVE (50), CNN_SAVE (25), BERT_CKPT_SAVE (10), KEEP (a directory for every run's output), OLD_TRAIN, CAPTURES2
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
. "$(dirname "$0")/lib/stats.sh"  # median, span, ratios, history_steps_per_s, text_lines
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
PARTS=${PARTS:-"recovery cost"}
MODELS=${MODELS:-"cnn bert_small"}
ROUNDS=${ROUNDS:-4}
CNN_STEPS=${CNN_STEPS:-300}
BERT_STEPS=${BERT_STEPS:-60}
WARMUP=${WARMUP:-10}
CNN_KILL=${CNN_KILL:-307}
BERT_KILL=${BERT_KILL:-70}
BERT_SAVE=${BERT_SAVE:-50}
CNN_SAVE=${CNN_SAVE:-25}
BERT_CKPT_SAVE=${BERT_CKPT_SAVE:-10}
gzrun=$build/tools/gzrun/gzrun
train=$build/apps/gz-train/gz-train
OLD_TRAIN=${OLD_TRAIN:-}
CAPTURES2=${CAPTURES2:-}
for f in "$gzrun" "$train" ${OLD_TRAIN:+"$OLD_TRAIN"}; do [ -x "$f" ] || { echo "missing $f: build first" >&2; exit 1; }; done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 GZ_LOG_LEVEL=info  # info: the restore and cost lines
work=${KEEP:-$(mktemp -d)}
mkdir -p "$work"
echo "runs: $work; build: $build ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "start: $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"

text_lines "$work/text"  # bert_small's data

args_of() {  # MODEL -> gz-train arguments
  case $1 in
    cnn) echo "--config $root/configs/fashion_mnist.yaml --test_limit 2000" ;;
    bert_small) echo "--dataset text_lines --train_data $work/text --test_data $work/text --net_type bert_small \
      --input_size 64 --num_classes 4 --batch_size 8 --eval_batch_size 64 --test_limit 200 --mode ddp \
      --num_workers 1 --num_threads 1" ;;
    *) echo "unknown model $1" >&2; exit 2 ;;
  esac
}

# gzrun_train DIR ENV... -- ARGS...: run, print wall seconds ("nan" on failure); output in DIR.out
gzrun_train() {
  local dir=$1 env=() t0 rc=0
  shift
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  rm -rf "$dir"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  env "${env[@]}" timeout 900 "$gzrun" --nproc-per-node 2 --master-port 0 --max-restarts 1 ${gzrun_flags:-} -- "${bin:-$train}" "$@" \
    --progress false --tensorboard true --log_every 10 --work_dir "$dir" >"$dir.out" 2>&1 || rc=$?
  [ $rc = 0 ] && echo "$(date +%s.%N) $t0" | awk '{printf "%.1f\n", $1 - $2}' || echo nan
}

redone() { python3 "$root/tests/train/check_sample_log.py" "$1" 2>&1 | sed -n 's/.*; \([0-9]*\) step(s) run twice.*/\1/p'; }

if [[ " $PARTS " = *" recovery "* ]]; then
  echo
  echo "| model | steps | killed at | REF s | DISK s | DISK lost s | DISK redone | SREF s | SNAP s | SNAP lost s | SNAP redone | restore | IN-PLACE s | IN-PLACE lost s | IN-PLACE redone | recovered |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"
  for model in $MODELS; do
    if [ "$model" = cnn ]; then steps=(--num_epochs 1); kill=$CNN_KILL; n=468; save=(); else
      steps=(--max_steps 100); kill=$BERT_KILL; n=100; save=(--save_steps "$BERT_SAVE"); fi
    # shellcheck disable=SC2046
    common=($(args_of "$model") "${steps[@]}" "${save[@]}" --log_samples true --resume_from_checkpoint auto)
    ref=$(gzrun_train "$work/$model-ref" X=1 -- "${common[@]}")
    disk=$(gzrun_train "$work/$model-disk" GZ_TRAIN_KILL_AT_STEP=$kill GZ_TRAIN_CRASH_RANK=1 -- "${common[@]}")
    sref=$(gzrun_train "$work/$model-sref" X=1 -- "${common[@]}" --snapshot_every 1)
    snap=$(gzrun_train "$work/$model-snap" GZ_TRAIN_KILL_AT_STEP=$kill GZ_TRAIN_CRASH_RANK=1 -- "${common[@]}" \
      --snapshot_every 1)
    inplace=$(gzrun_flags="--recovery in-place" gzrun_train "$work/$model-inplace" GZ_TRAIN_KILL_AT_STEP=$kill \
      GZ_TRAIN_CRASH_RANK=1 -- "${common[@]}" --snapshot_every 1)
    restore=$(grep -ho 'restored the snapshot of step [0-9]* ([^)]*) in [0-9.e-]* s' "$work/$model-snap.out" |
      sed 's/ (.*) / /' | head -n 1)
    recovered=$(grep -ho 'recovered in place at step [0-9]* in [0-9.e-]* s' "$work/$model-inplace.out" | head -n 1)
    echo "| $model | $n | $kill | $ref | $disk | $(awk "BEGIN{printf \"%.1f\", $disk - $ref}") | $(redone "$work/$model-disk") |" \
      "$sref | $snap | $(awk "BEGIN{printf \"%.1f\", $snap - $sref}") | $(redone "$work/$model-snap") | ${restore:-none} |" \
      "$inplace | $(awk "BEGIN{printf \"%.1f\", $inplace - $sref}") | $(redone "$work/$model-inplace") | ${recovered:-none} |"
  done
fi

if [[ " $PARTS " = *" ckpt "* ]]; then
  # ckpt_run MODEL MODE -> steps/s ("nan" on failure); the "checkpoints:" line in its .out
  ckpt_run() {
    local model=$1 mode=$2 max=$CNN_STEPS every=$CNN_SAVE flags env=X=1
    [ "$model" = bert_small ] && { max=$BERT_STEPS; every=$BERT_CKPT_SAVE; }
    case $mode in
      sync) flags="--save_steps $every --async_checkpoint false" ;;
      async) flags="--save_steps $every --async_checkpoint true" ;;
      async0) flags="--save_steps $every --async_checkpoint true"; env=GZ_DEFER_STATE_COPY=0 ;;
      none) flags="--save_checkpoints false" ;;
    esac
    # shellcheck disable=SC2046,SC2086
    [ "$(gzrun_train "$work/ckpt-$model-$mode-r$r" "$env" -- $(args_of "$model") --max_steps "$max" \
      --eval_steps 100000 --save_total_limit 2 $flags)" = nan ] && { echo nan; return; }
    history_steps_per_s "$work/ckpt-$model-$mode-r$r/history.jsonl" "$WARMUP"
  }
  declare -A csps cms
  for ((r = 1; r <= ROUNDS; ++r)); do
    for model in $MODELS; do
      order="sync async async0 none"
      [ $((r % 2)) = 0 ] && order="none async0 async sync"
      for mode in $order; do
        s=$(ckpt_run "$model" "$mode")
        csps[$model/$mode]="${csps[$model/$mode]:-} $s"
        line=$(grep -ho 'checkpoints: .*' "$work/ckpt-$model-$mode-r$r.out" | tail -n 1 || true)
        [ "$mode" = none ] || cms[$model/$mode]="${cms[$model/$mode]:-} $(sed -n 's/.* saved, \([0-9.e+-]*\) ms each.*/\1/p' <<<"$line")"
        printf 'ckpt round %d %-10s %-5s %9s steps/s  load %s  %s\n' "$r" "$model" "$mode" "$s" \
          "$(cut -d' ' -f1 /proc/loadavg)" "$line"
      done
    done
  done
  echo
  echo "| model | mode | step ms (median) | steps/s / NONE per round | median | training thread ms per save (per round) | median | that / NONE's step ms |"
  echo "|---|---|---:|---|---:|---|---:|---:|"
  for model in $MODELS; do
    none_ms=$(awk -v s="$(median "${csps[$model/none]}")" 'BEGIN{printf "%.1f", 1000 / s}')
    echo "| $model | none | $none_ms | | | | | |"
    for mode in sync async async0; do
      step=$(awk -v s="$(median "${csps[$model/$mode]}")" 'BEGIN{printf "%.1f", 1000 / s}')
      rat=$(ratios "${csps[$model/$mode]}" "${csps[$model/none]}")
      own=$(median "${cms[$model/$mode]:-}")
      share=$(awk -v a="$own" -v b="$none_ms" 'BEGIN{if (a == "nan") print "-"; else printf "%.1f %%", 100 * a / b}')
      echo "| $model | $mode | $step | $rat | $(median "$rat") | ${cms[$model/$mode]:-} | **$own** | **$share** |"
    done
  done
fi

[[ " $PARTS " = *" cost "* ]] || exit 0
modes="on off off2${OLD_TRAIN:+ old}${CAPTURES2:+ on2} on0"
# run MODEL MODE -> steps/s ("nan" on failure)
run() {
  local model=$1 mode=$2 dir every=0 bin=$train env=(X=1)
  dir=$work/$model-$mode-r$r
  case $mode in on | on0 | on2 | old) every=1 ;; esac
  [ "$mode" = old ] && bin=$OLD_TRAIN
  [ "$mode" = on2 ] && env+=(GZ_SNAPSHOT_CAPTURES=2)
  [ "$mode" = on0 ] && env+=(GZ_DEFER_STATE_COPY=0)
  local max=$CNN_STEPS
  [ "$model" = bert_small ] && max=$BERT_STEPS
  # shellcheck disable=SC2046
  [ "$(gzrun_train "$dir" "${env[@]}" -- $(args_of "$model") --max_steps "$max" --save_steps 100000 \
    --eval_steps 100000 --snapshot_every $every)" = nan ] && { echo nan; return; }
  history_steps_per_s "$dir/history.jsonl" "$WARMUP"
}
declare -A sps ms
loads=""
for ((r = 1; r <= ROUNDS; ++r)); do
  loads="$loads $(cut -d' ' -f1 /proc/loadavg)"
  for model in $MODELS; do
    order=$modes
    [ $((r % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$modes" | tac | tr '\n' ' ')
    for mode in $order; do
      s=$(run "$model" "$mode")
      sps[$model/$mode]="${sps[$model/$mode]:-} $s"
      own=""
      if [ "$mode" != off ] && [ "$mode" != off2 ]; then
        own=$(grep -o 'snapshots: .*' "$work/$model-$mode-r$r.out" | tail -n 1)
        ms[$model/$mode]="${ms[$model/$mode]:-} $(sed -n 's/.*(\([0-9.e+-]*\) ms each.*/\1/p' <<<"$own")"
      fi
      printf 'round %d %-10s %-4s %9s steps/s  load %s  %s\n' "$r" "$model" "$mode" "$s" \
        "$(cut -d' ' -f1 /proc/loadavg)" "$own"
    done
  done
done
echo
echo "end: $(date -u '+%F %T') UTC; 1-min load at each round's start:$loads"
echo
echo "| model | mode | step ms (median) | steps/s / OFF per round | median | training thread ms per snapshot (median) | that / OFF's step ms |"
echo "|---|---|---:|---|---:|---:|---:|"
for model in $MODELS; do
  off_ms=$(awk -v s="$(median "${sps[$model/off]}")" 'BEGIN{printf "%.1f", 1000 / s}')
  echo "| $model | off | $off_ms | | | | |"
  for mode in $modes; do
    [ "$mode" = off ] && continue
    step=$(awk -v s="$(median "${sps[$model/$mode]}")" 'BEGIN{printf "%.1f", 1000 / s}')
    rat=$(ratios "${sps[$model/$mode]}" "${sps[$model/off]}")
    own=$(median "${ms[$model/$mode]:-}")
    share=$(awk -v a="$own" -v b="$off_ms" 'BEGIN{if (a == "nan") print "-"; else printf "%.1f %%", 100 * a / b}')
    echo "| $model | $mode | $step | $rat | **$(median "$rat")** | ${own/nan/-} | $share |"
  done
done
