#!/usr/bin/env bash
# Elastic resume at full scale: the Fashion-MNIST config (configs/fashion_mnist.yaml, 10 epochs,
# global batch 128) trained uninterrupted on 2 processes, and on a simulated cluster of 3 hosts x 1
# rank under `gzrun --nnodes 2:3` with host 2 SIGKILLed in epoch 3 and started again in epoch 6
# (3 -> 2 -> 3 ranks, elastic_batch keep_global with global_batch_size 128). Prints both final
# accuracies, their difference (target: within 0.5 points), the elastic run's sample audit and its
# rounds. Root (namespaces). Run under the benchmark lock:
#   flock /work/.bench.lock bench/run_elastic_accuracy.sh [BUILD_DIR] [OUT_FILE]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/docs/results/elastic_accuracy.txt}
gzrun=$build/tools/gzrun/gzrun gztrain=$build/apps/gz-train/gz-train
cluster=$root/scripts/cluster.sh config=$root/configs/fashion_mnist.yaml
for f in "$gzrun" "$gztrain"; do [ -x "$f" ] || { echo "missing $f (build first)"; exit 1; }; done
"$cluster" check || exit $?
work=$(mktemp -d /tmp/gz_elastic_acc.XXXXXX)
id=elb$$
C=("$cluster" -c "$id")
cleanup() {
  for f in "$work"/gzpid_*; do [ -f "$f" ] && { p=$(cat "$f"); pkill -9 -P "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; }; done
  "${C[@]}" down >/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
common=(--progress false --tensorboard false --log_every 500 --save_steps 234 --save_total_limit 3)

{
  echo "# bench/run_elastic_accuracy.sh, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$root" rev-parse --short HEAD)"
  lscpu | head -n 8 | sed 's/^/# /'
  echo "# load at start: $(uptime)"
} | tee "$out"

# 1. Uninterrupted: 2 processes on this machine, the config as it is.
t=$(date +%s)
"$gzrun" --nproc-per-node 2 "$gztrain" --config "$config" --work_dir "$work/plain" --log_samples true "${common[@]}" \
  >"$work/plain.log" 2>&1 ||
  { tail -n 20 "$work/plain.log"; exit 1; }
plain=$(grep -o 'final: test_accuracy=[0-9.]*' "$work/plain.log" | cut -d= -f2)
echo "uninterrupted (2 processes, $(($(date +%s) - t)) s): $(grep -o 'final: .*' "$work/plain.log")" | tee -a "$out"

# 2. Elastic: 3 simulated hosts x 1 rank, 3 -> 2 -> 3.
"${C[@]}" up 3 >/dev/null || exit 1
master=$("${C[@]}" ip 0)
start() {  # host instance
  (
    "${C[@]}" run "$1" env -u GZ_NODE_ID GZ_RDZV_TOKEN="bench-$$" GZ_TIMEOUT_S=60 \
      sh -c 'echo $$ >"$0"; exec "$@"' "$work/gzpid_$1.$2" \
      "$gzrun" --nnodes 2:3 --master-addr "$master" --master-port 29500 --nproc-per-node 1 --rdzv-timeout 120 \
      --rdzv-join-window 2 --heartbeat-timeout 5 --grace-period 2 --max-restarts 2 -- \
      "$gztrain" --config "$config" --work_dir "$work/elastic" --global_batch_size 128 --log_samples true \
      --resume_from_checkpoint auto "${common[@]}" >>"$work/host$1.log" 2>&1
    echo $? >"$work/rc_$1.$2.tmp" && mv "$work/rc_$1.$2.tmp" "$work/rc_$1.$2"  # whole or absent
  ) 2>/dev/null &
}
wait_dir() {  # a checkpoint of the elastic run; gives up after 20 minutes or when a gzrun failed
  until [ -d "$work/elastic/checkpoints/$1" ]; do
    [ $(($(date +%s) - t)) -lt 1200 ] || { echo "timed out waiting for $1"; tail -n 20 "$work"/host*.log; exit 1; }
    for f in "$work"/rc_?.?; do [ -f "$f" ] && [ "$(cat "$f")" != 0 ] && [ "$f" != "$work/rc_2.0" ] &&
      { echo "a gzrun failed ($f)"; tail -n 20 "$work"/host*.log; exit 1; }; done
    sleep 1
  done
}
t=$(date +%s)
for i in 0 1 2; do start $i 0; done
wait_dir checkpoint-00001404   # epoch 3
p=$(cat "$work/gzpid_2.0")
kill -9 $(pgrep -P "$p") "$p"
echo "elastic: host 2 SIGKILLed after checkpoint 1404 ($(($(date +%s) - t)) s)" | tee -a "$out"
wait_dir checkpoint-00002808   # epoch 6, trained on 2 ranks
start 2 1
echo "elastic: host 2 started again after checkpoint 2808 ($(($(date +%s) - t)) s)" | tee -a "$out"
until [ -f "$work/rc_0.0" ] && [ -f "$work/rc_1.0" ] && [ -f "$work/rc_2.1" ]; do sleep 1; done
echo "elastic (3 -> 2 -> 3 ranks, $(($(date +%s) - t)) s): exit codes $(cat "$work/rc_0.0") $(cat "$work/rc_1.0") $(cat "$work/rc_2.1"):" \
  "$(grep -ho 'final: .*' "$work"/host*.log)" | tee -a "$out"
grep -h 'gzrun: \(elastic round\|job failure\|round . ends\|new round\|restarting\)' "$work/host0.log" | sed 's/^/  host0 /' | tee -a "$out"
elastic=$(grep -ho 'final: test_accuracy=[0-9.]*' "$work"/host*.log | cut -d= -f2)
/usr/bin/python3 "$root/tests/train/check_sample_log.py" "$work/elastic" --dataset-size 60000 --epochs 10 \
  --worlds 3,2,3 --reference "$work/plain" 2>&1 | tee -a "$out" || true
awk -v a="$plain" -v b="$elastic" 'BEGIN { d = (b - a) * 100; printf "accuracy: uninterrupted %.2f%%, elastic %.2f%%, difference %+.2f points (target within 0.5): %s\n", a * 100, b * 100, d, (d <= 0.5 && d >= -0.5) ? "met" : "MISSED" }' |
  tee -a "$out"
echo "# load at end: $(uptime)" | tee -a "$out"
