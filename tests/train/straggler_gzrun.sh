#!/usr/bin/env bash
# The straggler report through gzrun on one machine (no root needed): 3 ranks of gz-train in DDP
# mode over shm, a random rank spending 150 ms more in the data phase of every step (the test-only
# GZ_TEST_SLOW_DATA_MS). Rank 0 must name it and data loading by step 50, and print the summary.
#   straggler_gzrun.sh GZRUN GZ_TRAIN
set -uo pipefail
gzrun=$1 gztrain=$2
for f in "$gzrun" "$gztrain"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
victim=$((1 + RANDOM % 2))
GZ_TEST_SLOW_DATA_MS=150 GZ_TEST_SLOW_RANK=$victim timeout 240 "$gzrun" --nproc-per-node 3 -- "$gztrain" \
  --dataset synthetic --train_data 4000 --test_data 64 --net_type cnn --batch_size 16 --max_steps 45 \
  --mode ddp --num_workers 1 --progress false --tensorboard false --save_steps 100000 \
  --work_dir "$dir/work" >"$dir/out.log" 2>&1
rc=$?
fail() { grep -v '^\[.\] \[train\]' "$dir/out.log" | tail -n 30; echo "FAIL: $* (victim rank $victim)"; exit 1; }
[ $rc = 0 ] || fail "gzrun exited $rc"
first=$(grep -m1 'gz warn r0\] straggler (step [0-9]*): ' "$dir/out.log")
echo "$first" | grep -q "straggler (step [0-9]*): rank $victim ([^)]*) is [0-9.]* ms/step behind the median, in data loading" ||
  fail "wrong or no warning: '$first'"
step=$(echo "$first" | sed -n 's/.*straggler (step \([0-9]*\)).*/\1/p')
[ -n "$step" ] && [ "$step" -le 50 ] || fail "named at step ${step:-?}"
grep -q "rank $victim ([^)]*): late in [0-9]* of [0-9]* windows" "$dir/out.log" || fail "no summary naming rank $victim"
grep -q '"kind":"straggler"' "$dir/work/history.jsonl" || fail "no straggler rows in history.jsonl"
echo "PASS: $first"
