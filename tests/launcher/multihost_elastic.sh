#!/usr/bin/env bash
# Elastic membership of gzrun (--nnodes MIN:MAX) on a simulated cluster (scripts/cluster.sh).
#
#   multihost_elastic.sh CLUSTER_SH GZRUN TEST_WORKER GZ_TRAIN CONFIG CHECKER SCENARIO
#     resize    3 hosts, --nnodes 2:3, gz-train (CONFIG, one rank per host, samples logged):
#               host 2's gzrun and worker are SIGKILLed mid-training; the survivors must stop
#               their workers within the heartbeat timeout + 2 s and go on as 2 nodes (round 1,
#               resumed from the last checkpoint); then host 2's gzrun is started again and is
#               admitted at round 2 (3 nodes). The job must finish, and CHECKER must find every
#               epoch read each sample exactly once across the 3 -> 2 -> 3 worlds.
#     snapshot  as resize, with in-memory snapshots every step and disk checkpoints only at epoch
#               ends: host 2 is lost whole (gzrun and worker SIGKILLed, its /dev/shm wiped); the
#               survivors must restore the snapshot of the last step (at most 1 step redone per
#               restart); host 2 comes back with an empty /dev/shm and gets the snapshot from a
#               peer over the network.
#     belowmin  2 hosts, --nnodes 2:3 (gzrun_test_worker job): the job starts with 2 nodes after
#               the join window; host 1's gzrun is SIGKILLed: host 0 must give up within the bound,
#               saying that fewer than MIN nodes are left, and exit 1.
#     ghost     3 hosts, --nnodes 1:2: hosts 0 and 1 run round 0 (full); host 2's gzrun waits for
#               round 1 and is SIGKILLed there (a ghost joiner); then host 1 is SIGKILLed. Host 0
#               must start round 1 alone after the join window, never with the ghost as node 1
#               (which would hang the round until the heartbeat timeout), and finish.
#     inplace   3 hosts x 2 ranks, --nnodes 2:3, gz-train (CONFIG, snapshots every step, samples
#               logged) under gzrun --recovery in-place --max-restarts 1: host 1's local rank 1 is
#               SIGKILLed as step KILL_STEP begins (gz-train's GZ_TRAIN_KILL_AT_STEP). Host 1's gzrun
#               must replace that worker alone (no job-wide restart, no new round), the 5 others
#               keep their process and recover in place (rank 0: within 30 s, from the snapshot),
#               the job must finish, and CHECKER must find at most 1 step redone.
# Env: HB (heartbeat timeout, default 3 s), KEEP_LOGS=DIR. Exit 77 (skip) without namespaces.
set -uo pipefail
[ $# = 7 ] || { echo "usage: multihost_elastic.sh CLUSTER_SH GZRUN TEST_WORKER GZ_TRAIN CONFIG CHECKER SCENARIO" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3 gztrain=$4 config=$5 checker=$6 scenario=$7
for f in "$cluster" "$gzrun" "$worker" "$checker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?

hb=${HB:-3}
log_level=warn
case $scenario in snapshot|zero3|inplace) log_level=info ;; esac  # the restores' and resumes' lines
bound_ms=$(((hb + 2) * 1000))
port=29500
case $scenario in
  resize|snapshot|zero3|inplace)
    [ -x "$gztrain" ] || { echo "SKIP: gz-train not built ($gztrain)"; exit 77; }
    [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
      { echo "SKIP: Fashion-MNIST not installed (dataset-fashion-mnist)"; exit 77; }
    hosts=3 ;;
  belowmin) hosts=2 ;;
  ghost) hosts=3 ;;
  *) echo "FAIL: unknown scenario '$scenario'"; exit 2 ;;
esac

id=el$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
starts=0
fail() {
  for f in "$dir"/host*.log; do
    echo "---- $(basename "$f") (last 40 lines)"
    grep -v '\[train\]' "$f" | tail -n 40
  done
  echo "FAIL: $scenario: $*"
  exit 1
}
cleanup() {
  for f in "$dir"/gzpid_*; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    kill -CONT "$p" 2>/dev/null
    for c in $(pgrep -P "$p"); do kill -9 "$c" 2>/dev/null; done
    kill -9 "$p" 2>/dev/null
  done
  "${C[@]}" down
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/host*.log "$KEEP_LOGS"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up "$hosts" || exit $?
master=$("${C[@]}" ip 0)
now_ns() { date +%s%N; }
ms_since() { echo $((($(now_ns) - $1) / 1000000)); }

# Start gzrun on host $1 as instance k (set to $starts, returned in $k): pid in gzpid_$1.$k, exit
# code in rc_$1.$k. Arguments after $1: VAR=VALUE for this gzrun's environment (its workers').
# nproc, max_restarts, nnodes and gzrun_args (an array) change the gzrun options.
start_node() {
  local i=$1
  shift
  k=$starts
  starts=$((starts + 1))
  (
    "${C[@]}" run "$i" env -u GZ_NODE_ID GZ_RDZV_TOKEN="el-test-$$" GZ_TIMEOUT_S=20 GZ_LOG_LEVEL="$log_level" "$@" \
      sh -c 'echo $$ >"$0"; exec "$@"' "$dir/gzpid_$i.$k" \
      "$gzrun" --nnodes "${nnodes:-2:3}" --master-addr "$master" --master-port $port --nproc-per-node "${nproc:-1}" \
      --rdzv-timeout 30 --rdzv-join-window 1 --heartbeat-timeout "$hb" --grace-period 1 \
      --max-restarts "${max_restarts:-2}" ${gzrun_args[@]+"${gzrun_args[@]}"} -- "${program[@]}" \
      >>"$dir/host$i.log" 2>&1
    echo $? >"$dir/rc_$i.$k.tmp" && mv "$dir/rc_$i.$k.tmp" "$dir/rc_$i.$k"  # whole or absent
  ) 2>/dev/null &  # no "Killed" notices from this shell: the test kills gzruns on purpose
}
wait_for() {  # SECONDS DESCRIPTION COMMAND...: poll every 50 ms
  local secs=$1 limit=$(($1 * 20)) what=$2
  shift 2
  for ((t = 0; t < limit; ++t)); do "$@" && return 0; sleep 0.05; done
  fail "timed out ($secs s) waiting for: $what"
}
in_log() { grep -q "$2" "$dir/host$1.log" 2>/dev/null; }
gone() { for p in "$@"; do kill -0 "$p" 2>/dev/null && return 1; done; return 0; }

if [ "$scenario" = belowmin ]; then
  program=("$worker" job "$dir" -1 0 0 400 0)
  t_start=$(now_ns)
  start_node 0; k0=$k
  start_node 1; k1=$k
  wait_for 30 "both nodes in round 0" bash -c "grep -q 'elastic round 0: node . of 2' '$dir/host0.log' && grep -q 'elastic round 0: node . of 2' '$dir/host1.log'"
  started_ms=$(ms_since "$t_start")
  [ "$started_ms" -ge 1000 ] || fail "round 0 started after $started_ms ms, before the 1 s join window passed"
  wait_for 30 "workers running" bash -c "ls '$dir'/pid_0 '$dir'/pid_1 >/dev/null 2>&1"
  sleep 0.5
  workers0=$(pgrep -P "$(cat "$dir/gzpid_0.$k0")")
  t0=$(now_ns)
  kill -9 "$(cat "$dir/gzpid_1.$k1")" $(pgrep -P "$(cat "$dir/gzpid_1.$k1")")
  wait_for 20 "host 0's gzrun to end" test -f "$dir/rc_0.$k0"
  ms=$(ms_since "$t0")
  [ "$ms" -le "$bound_ms" ] || fail "host 0 took $ms ms to end after node 1 was lost (bound $bound_ms ms)"
  gone $workers0 || fail "host 0's workers still run"
  [ "$(cat "$dir/rc_0.$k0")" = 1 ] || fail "host 0's gzrun exited $(cat "$dir/rc_0.$k0"), expected 1"
  in_log 0 "giving up: node 1 lost: 1 node(s) left, fewer than the minimum of 2 (--nnodes 2:3)" ||
    fail "host 0 does not say that fewer than MIN nodes are left"
  echo "PASS: belowmin: round 0 started with 2 of 2:3 nodes after the join window ($started_ms ms); node 1" \
    "SIGKILLed: host 0 gave up in $ms ms (bound $bound_ms ms): fewer than MIN nodes left"
  exit 0
fi

if [ "$scenario" = ghost ]; then
  nnodes=1:2
  program=("$worker" job "$dir" -1 0 0 80 0)  # 8 s of 100 ms steps per attempt
  start_node 0; k0=$k
  start_node 1; k1=$k
  wait_for 30 "both nodes in round 0" bash -c "grep -q 'elastic round 0: node . of 2' '$dir/host0.log' && grep -q 'elastic round 0: node . of 2' '$dir/host1.log'"
  start_node 2; k2=$k
  wait_for 20 "host 2 waiting for round 1" in_log 2 "waiting to join the job at round 1"
  sleep 0.5
  kill -9 "$(cat "$dir/gzpid_2.$k2")"  # a ghost in round 1's joined list
  sleep 0.3
  kill -9 "$(cat "$dir/gzpid_1.$k1")" $(pgrep -P "$(cat "$dir/gzpid_1.$k1")")
  wait_for 30 "host 0 in round 1" in_log 0 "elastic round 1: node"
  in_log 0 "elastic round 1: node 0 of 1 " ||
    fail "host 0's round 1 did not start alone: $(grep 'elastic round 1' "$dir/host0.log")"
  wait_for 30 "host 0's gzrun to end" test -f "$dir/rc_0.$k0"
  [ "$(cat "$dir/rc_0.$k0")" = 0 ] || fail "host 0's gzrun exited $(cat "$dir/rc_0.$k0"), expected 0"
  # The ghost is named by its gzrun's id in the members' list ("host:pid.random"), never by "ghost".
  ghost_pid=$(cat "$dir/gzpid_2.$k2")
  grep 'elastic round' "$dir/host0.log" | grep -q ":$ghost_pid\b" &&
    fail "the ghost (host 2, pid $ghost_pid) was made a member: $(grep 'elastic round' "$dir/host0.log")"
  echo "PASS: ghost: host 2's gzrun killed while waiting for round 1, host 1 lost: host 0 ran round 1 alone" \
    "and finished"
  exit 0
fi

rank0_steps() {  # rank 0's sample log of the newest session has more than $1 steps done
  local f
  f=$(ls -t "$dir"/work/samples/session-*-rank0.txt 2>/dev/null | head -n 1)
  [ -n "$f" ] && [ "$(grep -c '^done ' "$f")" -gt "$1" ]
}
# Not `cat | grep -q`: under pipefail, cat killed by SIGPIPE after an early match fails the pipeline.
any_log() { grep -q -h "$1" "$dir"/host*.log 2>/dev/null; }

if [ "$scenario" = inplace ]; then
  # World 6, global batch 192: 25 steps an epoch, 50 in all; the kill lands mid-epoch 1 (not at an
  # epoch's end, whose step has no snapshot). The victim is host 1's local rank 1 whatever node rank
  # the rendezvous gives host 1 (by first arrival): only host 1's gzrun has GZ_TRAIN_KILL_AT_STEP,
  # and the wrapper names its local rank 1 as gz-train's crash rank (exec: no process in between).
  epochs=2 kill_step=37
  nproc=2 max_restarts=1 gzrun_args=(--recovery in-place)
  program=(sh -c 'GZ_TRAIN_CRASH_RANK=$((NODE_RANK * LOCAL_WORLD_SIZE + 1)) exec "$0" "$@"' "$gztrain"
           --config "$config" --work_dir "$dir/work" --num_epochs $epochs --snapshot_every 1 --save_steps 0
           --resume_from_checkpoint auto --log_samples true)
  t_start=$(now_ns)
  start_node 0; k0=$k
  start_node 1 GZ_TRAIN_KILL_AT_STEP=$kill_step; k1=$k
  start_node 2; k2=$k
  ks=("$k0" "$k1" "$k2")
  for i in 0 1 2; do wait_for 60 "host $i in round 0 with 3 nodes" in_log $i 'elastic round 0: node . of 3'; done
  wait_for 90 "round 0 to train 3 steps" rank0_steps 3
  declare -A host_of
  workers=""
  for i in 0 1 2; do
    for p in $(pgrep -P "$(cat "$dir/gzpid_$i.${ks[$i]}")"); do host_of[$p]=$i; workers+=" $p"; done
  done
  [ "${#host_of[@]}" = 6 ] || fail "expected 6 workers (3 hosts x 2), found ${#host_of[@]}:$workers"
  victim=""
  one_dead() { for p in $workers; do kill -0 "$p" 2>/dev/null || { victim=$p; return 0; }; done; return 1; }
  wait_for 120 "a worker to be SIGKILLed at step $kill_step" one_dead
  t0=$(now_ns)
  [ "${host_of[$victim]}" = 1 ] ||
    fail "the first worker lost (pid $victim) ran on host ${host_of[$victim]}, not 1"
  # Whichever way the job goes on: in place (the survivors' rank 0), or a job-wide restart.
  wait_for 60 "the job to recover" any_log 'recovered in place at step\|restarting all\|giving up'
  recover_ms=$(ms_since "$t0")
  # (2) Host 1 replaced its worker alone; no host restarted its workers, no node left the round.
  for i in 0 1 2; do
    ! in_log $i 'restarting all' ||
      fail "host $i restarted the job: $(grep -h 'restarting all' "$dir/host$i.log")"
    ! in_log $i 'job failure in round' ||
      fail "host $i saw a job failure: $(grep -h 'job failure' "$dir/host$i.log")"
  done
  in_log 1 "(pid $victim) .*; replacing it in place (replacement 1 of 1): the other workers keep running" ||
    fail "host 1 did not replace its worker (pid $victim) in place"
  for i in 0 2; do ! in_log $i 'replacing it in place' || fail "host $i replaced a worker too"; done
  vrank=$(grep -h "(pid $victim) .*replacing it in place" "$dir/host1.log" |
    sed -n 's/.*gzrun: rank \([0-9]*\) (pid.*/\1/p' | head -n 1)
  [ -n "$vrank" ] || fail "host 1's gzrun does not name the victim's rank"
  # (3) The survivors kept their process and recovered in place; rank 0 says when and from what.
  for p in $workers; do
    [ "$p" = "$victim" ] || kill -0 "$p" 2>/dev/null ||
      fail "survivor pid $p (host ${host_of[$p]}) is gone: a survivor was stopped"
  done
  for r in 0 1 2 3 4 5; do
    [ "$r" = "$vrank" ] && continue
    any_log "r$r\] rank $r: .*; recovering in place (recovery 1" || fail "rank $r did not recover in place"
  done
  line=$(grep -h 'recovered in place at step' "$dir"/host*.log | head -n 1)
  rec_step=$(echo "$line" | sed -n 's/.*recovered in place at step \([0-9]*\) in.*/\1/p')
  rec_s=$(echo "$line" | sed -n 's/.*recovered in place at step [0-9]* in \([0-9.]*\) s (.*/\1/p')
  [ -n "$rec_step" ] && [ -n "$rec_s" ] || fail "cannot read rank 0's recovery line: $line"
  echo "$line" | grep -q '(snapshot)' || fail "rank 0 did not recover from a snapshot: $line"
  [ "$rec_step" -ge $((kill_step - 1)) ] && [ "$rec_step" -le "$kill_step" ] ||
    fail "recovered at step $rec_step, the kill was at step $kill_step: $line"
  [ "$recover_ms" -le 30000 ] || fail "rank 0 recovered $recover_ms ms after the kill (bound 30000 ms)"
  # (1) The job finishes: every gzrun exits 0.
  for i in 0 1 2; do wait_for 120 "host $i's gzrun to finish" test -f "$dir/rc_$i.${ks[$i]}"; done
  total_ms=$(ms_since "$t_start")
  for i in 0 1 2; do
    [ "$(cat "$dir/rc_$i.${ks[$i]}")" = 0 ] || fail "host $i's gzrun exited $(cat "$dir/rc_$i.${ks[$i]}")"
  done
  ! any_log 'restarting all\|elastic round 1' || fail "a job-wide restart or new round after the recovery"
  final=$(grep -ho 'final: test_accuracy=[0-9.]*' "$dir"/host*.log | tail -n 1)
  [ -n "$final" ] || fail "no final evaluation line"
  # (4) Every sample once an epoch over both sessions (before and after the recovery, world 6 each),
  # at most the step of the snapshot not yet written redone.
  audit=$(/usr/bin/python3 "$checker" "$dir/work" --dataset-size 4800 --epochs $epochs --worlds 6,6 2>&1) ||
    fail "$audit"
  redone=$(echo "$audit" | sed -n 's/.*; \([0-9]*\) step(s) run twice.*/\1/p')
  [ -n "$redone" ] && [ "$redone" -le 1 ] ||
    fail "${redone:-?} steps redone after an in-place recovery (at most 1): $audit"
  echo "PASS: inplace: 3 hosts x 2 ranks, rank $vrank (host 1, local rank 1) SIGKILLed at step $kill_step:" \
    "host 1 replaced it in place (no restart, no new round), the 5 others kept their process; rank 0 recovered at" \
    "step $rec_step in $rec_s s (snapshot), $recover_ms ms after the kill was seen -> finished in $total_ms ms" \
    "($final); $audit"
  exit 0
fi

# resize (and snapshot): 3 -> 2 -> 3 with gz-train.
program=("$gztrain" --config "$config" --work_dir "$dir/work" --num_epochs 3)
[ "$scenario" = snapshot ] && program+=(--snapshot_every 1 --save_steps 0)
# zero3: ZeRO stage 3 over an mlp's layers (units); its sharded checkpoints reshard 3 -> 2 -> 3.
[ "$scenario" = zero3 ] && program+=(--zero_stage 3 --net_type mlp --hidden 256 --layers 3)
start_node 0; k0=$k
start_node 1; k1=$k
start_node 2; k2=$k
for i in 0 1 2; do wait_for 60 "host $i in round 0 with 3 nodes" in_log $i 'elastic round 0: node . of 3'; done
if [ "$scenario" = snapshot ]; then
  wait_for 90 "round 0 to train 17 steps" rank0_steps 17
else
  wait_for 90 "a checkpoint at step 15" test -d "$dir/work/checkpoints/checkpoint-00000015"
fi
survivors="$(pgrep -P "$(cat "$dir/gzpid_0.$k0")") $(pgrep -P "$(cat "$dir/gzpid_1.$k1")")"
victim=$(cat "$dir/gzpid_2.$k2")
t0=$(now_ns)
kill -9 "$victim" $(pgrep -P "$victim")
[ "$scenario" = snapshot ] && "${C[@]}" run 2 sh -c 'rm -rf /dev/shm/gz-snapshots-*'  # the node is gone
# Every survivor's worker stops (raises, or gzrun stops it) within the bound.
wait_for 20 "the survivors' round-0 workers to stop" gone $survivors
stop_ms=$(ms_since "$t0")
[ "$stop_ms" -le "$bound_ms" ] || fail "survivors' workers stopped $stop_ms ms after the fault (bound $bound_ms ms)"
for i in 0 1; do wait_for 30 "host $i in round 1 with 2 nodes" in_log $i 'elastic round 1: node . of 2'; done
for i in 0 1; do in_log $i 'job failure in round 0: ' || fail "host $i reports no failure of round 0"; done
if [ "$scenario" = snapshot ]; then
  wait_for 60 "round 1 to restore a snapshot" any_log 'restored the snapshot of step .* held by [12] of 2 rank'
fi
# Round 1 trains on 2 ranks for a while (its sample log grows), then host 2 comes back.
round1_steps() {
  local f
  for f in "$dir"/work/samples/session-*-rank0.txt; do
    head -n 1 "$f" | grep -q ' world 2 ' && [ "$(grep -c '^done ' "$f")" -gt 10 ] && return 0
  done
  return 1
}
wait_for 60 "round 1 to train 10 steps on 2 ranks" round1_steps
t1=$(now_ns)
start_node 2; k2b=$k
for i in 0 1 2; do wait_for 30 "host $i in round 2 with 3 nodes" in_log $i 'elastic round 2: node . of 3'; done
# An admission is no failure: no verdict may blame the peers stopped for it (and delay node 0).
for i in 0 1; do
  ! awk '/round 1 ends: node\(s\) waiting to join/ {on = 1} /elastic round 2:/ {on = 0} on && /verdict:/' \
    "$dir/host$i.log" | grep . || fail "host $i printed a verdict for the admission round"
done

admit_ms=$(ms_since "$t1")
for i in 0 1; do
  in_log $i 'new round 2 to admit waiting node(s) (no restart counted)' || fail "host $i: no admission round"
done
wait_for 120 "host 0's gzrun to finish" test -f "$dir/rc_0.$k0"
wait_for 30 "host 1's gzrun to finish" test -f "$dir/rc_1.$k1"
wait_for 30 "host 2's gzrun to finish" test -f "$dir/rc_2.$k2b"
for f in "rc_0.$k0" "rc_1.$k1" "rc_2.$k2b"; do
  [ "$(cat "$dir/$f")" = 0 ] || fail "gzrun ($f) exited $(cat "$dir/$f")"
done
final=$(grep -ho 'final: test_accuracy=[0-9.]*' "$dir"/host*.log | tail -n 1)
[ -n "$final" ] || fail "no final evaluation line"
audit=$(/usr/bin/python3 "$checker" "$dir/work" --dataset-size 4800 --epochs 3 --worlds 3,2,3 2>&1) || fail "$audit"
if [ "$scenario" = snapshot ]; then
  # Round 2: host 2's folder is empty, a peer sends it the snapshot.
  any_log 'restored the snapshot of step .* held by [12] of 3 rank(s), sent by rank' ||
    fail "round 2 did not send the snapshot to the returning node: $(grep 'restored\|resumed' "$dir/host0.log")"
  redone=$(echo "$audit" | sed -n 's/.*; \([0-9]*\) step(s) run twice.*/\1/p')
  [ -n "$redone" ] && [ "$redone" -le 2 ] || fail "$redone steps redone over 2 restarts (at most 1 each): $audit"
  restores=$(grep -h 'restored the snapshot' "$dir"/host*.log | sed 's/.*\] //' | tr '\n' ';')
  echo "PASS: snapshot: node 2 lost whole mid-epoch, survivors restored in round 1, node 2 back with an" \
    "empty /dev/shm got the snapshot over the network in round 2 ($restores) -> finished ($final); $audit"
  exit 0
fi
if [ "$scenario" = zero3 ]; then
  newest=$(ls -d "$dir"/work/checkpoints/checkpoint-* | tail -n 1)
  grep -q 'gz-checkpoint-sharded' "$newest/manifest.json" 2>/dev/null ||
    fail "the newest checkpoint is not sharded: $(ls "$newest" 2>&1)"
  for w in '2 rank(s), checkpoint written by 3' '3 rank(s), checkpoint written by 2'; do
    grep -q -h "resuming on $w" "$dir"/host*.log || fail "no resume on $w: $(grep -h 'resum' "$dir"/host*.log)"
  done
fi
echo "PASS: $scenario: 3 nodes -> node 2 SIGKILLed: survivors' workers stopped in $stop_ms ms (bound $bound_ms ms)," \
  "2 nodes in round 1 -> node 2 back: admitted, 3 nodes in round 2 after $admit_ms ms -> finished ($final);" \
  "$audit"
