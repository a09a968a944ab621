#!/usr/bin/env bash
# The straggler report on the simulated cluster (scripts/cluster.sh): 4 hosts x 2 ranks, gz-train
# in DDP mode (hier(shm+gloo)), every link shaped to 1 Gbit/s, one fault on a random victim:
#
#   multihost_straggler.sh CLUSTER_SH GZRUN GZ_TRAIN ROW [VICTIM]
#     data     rank VICTIM spends 200 ms more in the data phase of every step (GZ_TEST_SLOW_DATA_MS,
#              the test-only injection of gz-train)
#     compute  rank VICTIM's process runs under a cgroup v1 CPU quota (QUOTA_PCT % of one core,
#              default 2) from its start
#     link     host VICTIM's link is shaped to 100 Mbit/s, 1/10 of the others
#     none     no fault: nobody may be named
#
# Passes when rank 0's first straggler warning names the victim (rank and host; host and its
# ranks for the link) and the cause (data loading / compute / slow network link), printed at a
# step <= 50, and
# no other rank or host is named. VICTIM defaults to a random rank (host for link). Prints one
# "RESULT row=... victim=... named=... step=... ok=0|1" line (bench/run_straggler_matrix.sh counts
# them). Env: STEPS (45), QUOTA_PCT (2), KEEP_LOGS=DIR. Exit 77 (skip) without root/namespaces/cgroup v1 cpu.
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: multihost_straggler.sh CLUSTER_SH GZRUN GZ_TRAIN data|compute|link|none [VICTIM]" >&2; exit 2; }
cluster=$1 gzrun=$2 gztrain=$3 row=$4
for f in "$cluster" "$gzrun" "$gztrain"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?
hosts=4 per=2
world=$((hosts * per))
steps=${STEPS:-45}
case $row in
  data | compute | none) victim=${5:-$((RANDOM % world))}; vhost=$((victim / per)) ;;
  link) vhost=${5:-$((RANDOM % hosts))}; victim=$((vhost * per)) ;;
  *) echo "FAIL: unknown row '$row'"; exit 2 ;;
esac
cg=/sys/fs/cgroup/cpu
if [ "$row" = compute ] && ! [ -w "$cg" ]; then echo "SKIP: no writable cgroup v1 cpu controller at $cg"; exit 77; fi

id=str$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
cgroup=$cg/gz_straggler_$$
cleanup() {
  for f in "$dir"/gzpid_*; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    for c in $(pgrep -P "$p"); do kill -9 "$c" 2>/dev/null; done
    kill -9 "$p" 2>/dev/null
  done
  "${C[@]}" down >/dev/null
  if [ -d "$cgroup" ]; then
    for p in $(cat "$cgroup/cgroup.procs" 2>/dev/null); do echo "$p" >"$cg/cgroup.procs" 2>/dev/null; done
    rmdir "$cgroup" 2>/dev/null
  fi
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/host*.log "$dir"/work/history.jsonl "$KEEP_LOGS"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
result() {  # ok named step
  echo "RESULT row=$row victim=$([ "$row" = link ] && echo "h$vhost" || echo "$victim") named=$2 step=$3 ok=$1"
}
fail() {
  echo "---- host0.log (straggler lines and last 15 lines)"
  grep -E 'straggler|error' "$dir/host0.log" | head -n 20
  tail -n 15 "$dir/host0.log"
  result 0 "${2:-none}" "${3:--}"
  echo "FAIL: $row (victim $victim, host h$vhost): $1"
  exit 1
}

"${C[@]}" up "$hosts" --rate 1gbit >/dev/null || exit $?
master=$("${C[@]}" ip 0)
[ "$row" = link ] && { "${C[@]}" rate "$vhost" 100mbit || fail "cannot shape host $vhost"; }
env_fault=()
[ "$row" = data ] && env_fault=(GZ_TEST_SLOW_DATA_MS=200 GZ_TEST_SLOW_RANK="$victim")
program=("$gztrain" --dataset synthetic --train_data 8000 --test_data 64 --net_type cnn --batch_size 16
  --max_steps "$steps" --mode ddp --backend auto --num_workers 1 --progress false --tensorboard false
  --save_steps 100000 --work_dir "$dir/work" --straggler.every 10)
port=$((20000 + RANDOM % 20000))
for ((i = 0; i < hosts; ++i)); do
  (
    "${C[@]}" run "$i" env -u GZ_NODE_ID GZ_RDZV_TOKEN="straggler-$$" GZ_TIMEOUT_S=60 "${env_fault[@]}" \
      sh -c 'echo $$ >"$0"; exec "$@"' "$dir/gzpid_$i" \
      "$gzrun" --nnodes "$hosts" --node-rank "$i" --master-addr "$master" --master-port "$port" \
      --nproc-per-node "$per" --rdzv-timeout 60 -- "${program[@]}" >"$dir/host$i.log" 2>&1
    echo $? >"$dir/rc_$i"
  ) 2>/dev/null &  # no "Killed" notices when the cleanup kills a run
done

if [ "$row" = compute ]; then
  # Throttle the victim's process as soon as it exists (all its threads move with it).
  mkdir -p "$cgroup" && echo 100000 >"$cgroup/cpu.cfs_period_us" &&
    echo $((1000 * ${QUOTA_PCT:-2})) >"$cgroup/cpu.cfs_quota_us" || fail "cannot set up cgroup $cgroup"
  pid=""
  for ((t = 0; t < 600; ++t)); do
    [ -z "$pid" ] || break
    gp=$(cat "$dir/gzpid_$vhost" 2>/dev/null)
    for c in $([ -n "$gp" ] && pgrep -P "$gp"); do
      tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$victim" && pid=$c
    done
    [ -n "$pid" ] || sleep 0.05
  done
  [ -n "$pid" ] || fail "rank $victim's process never appeared"
  echo "$pid" >"$cgroup/cgroup.procs" || fail "cannot move pid $pid into $cgroup"
fi

for ((t = 0; t < 4000; ++t)); do
  n=0
  for ((i = 0; i < hosts; ++i)); do [ -f "$dir/rc_$i" ] && n=$((n + 1)); done
  [ $n = $hosts ] && break
  sleep 0.05
done
[ $n = $hosts ] || fail "the job did not finish within 200 s"
for ((i = 0; i < hosts; ++i)); do [ "$(cat "$dir/rc_$i")" = 0 ] || fail "host $i's gzrun exited $(cat "$dir/rc_$i")"; done
grep -q 'straggler report:' "$dir/host0.log" || fail "no end-of-training summary"
first=$(grep -m1 'gz warn r0\] straggler (step [0-9]*): ' "$dir/host0.log")
if [ "$row" = none ]; then
  [ -z "$first" ] || fail "a healthy job named a straggler: $first" "$(echo "$first" | grep -o 'rank [0-9]*\|host h[0-9]*' | head -1)"
  grep -q 'no straggler' "$dir/host0.log" || fail "the summary does not say 'no straggler'"
  result 1 none -
  echo "PASS: none: nobody named in $steps steps"
  exit 0
fi
[ -n "$first" ] || fail "nobody was named"
step=$(echo "$first" | sed -n 's/.*straggler (step \([0-9]*\)).*/\1/p')  # when it was printed
case $row in
  data) want="rank $victim (h$vhost) is [0-9.]* ms/step behind the median, in data loading" ;;
  compute) want="rank $victim (h$vhost) is [0-9.]* ms/step behind the median, in compute" ;;
  link) want="host h$vhost (ranks $victim, $((victim + 1))) has a slow network link" ;;
esac
named=$(echo "$first" | grep -o 'rank [0-9]* (h[0-9]*)\|host h[0-9]* (ranks [0-9, ]*)' | head -1)
echo "$first" | grep -q "straggler (step [0-9]*): $want" || fail "wrong name or cause: $first" "$named" "$step"
[ -n "$step" ] && [ "$step" -le 50 ] || fail "named only at step ${step:-?} (> 50): $first" "$named" "$step"
result 1 "$named" "$step"
echo "PASS: $row: $first"
