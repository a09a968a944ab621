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
#     inplace   H hosts x 2 ranks (HOSTS, default 4), --nnodes 2:H, gz-train (CONFIG, snapshots every step, samples
#               logged) under gzrun --recovery in-place --max-restarts 1: host 1's local rank 1 is
#               SIGKILLed as step KILL_STEP begins (gz-train's GZ_TRAIN_KILL_AT_STEP). Host 1's gzrun
#               must replace that worker alone (no job-wide restart, no new round), the 2H-1 others
#               keep their process and recover in place (rank 0: within 30 s, from the snapshot),
#               the job must finish, and CHECKER must find at most 1 step redone. First the same job
#               runs uninterrupted (no kill; logs ref_host*.log): the recovered job's final test
#               accuracy must be within 0.005 of it, and every step must read its samples.
#     inplace2  as inplace on 3 hosts (always), two workers on two hosts SIGKILLed as the same step begins: host 1's
#               local rank 1 and host 2's local rank 0 (its local rank 1 when host 2 is node 0: rank
#               0 must survive to report). Each host's gzrun replaces its own worker; the 4 others
#               keep their process and recover in place from both losses in one recovery.
#     inplacenode  H hosts x 2 ranks (HOSTS, default 4), --nnodes H-1:H, gz-train (snapshots every
#               step) under gzrun --recovery in-place: the last host is lost whole (gzrun and
#               workers SIGKILLed, its /dev/shm wiped) mid-epoch. The other hosts' gzruns must move
#               their workers to round 1 (2H-2 ranks) without stopping them: the survivors keep
#               their pids, rank 0 recovers in place from the snapshot within the heartbeat timeout
#               + 5 s of the kill (the rendezvous' 1 s join window included). Then the host comes
#               back (empty /dev/shm): the survivors move again (round 2, 2H ranks), its fresh
#               workers get the snapshot over the network. The job must finish with every gzrun
#               exiting 0, at most 1 step redone per move, every epoch read exactly once across
#               worlds 2H, 2H-2, 2H, and a final test accuracy within 0.005 of the uninterrupted
#               run's (run first, as in inplace).
#     pynode    as inplacenode for Python: 3 hosts x 2 ranks, --nnodes 2:3, --recovery in-place,
#               PY_WORKER (python/tests/workers/elastic_in_place.py: hvd.elastic.run, a commit per
#               step, a reset callback setting lr = base x hvd.size()) under /usr/bin/python3 with
#               PYTHONPATH=PY_PATH (the build's python/). Host 2 is lost whole mid-training (gzrun
#               and workers SIGKILLed, its /dev/shm wiped): the 4 survivors keep their pids and
#               continue as ranks of 4 from their last commit within the heartbeat timeout + 5 s;
#               then host 2 comes back and is admitted in place (survivors keep their pids, world 6,
#               the returning workers get the commit over the network); every gzrun exits 0. From
#               the COMMIT lines: every step committed on one world only (none redone on another),
#               by every rank of it once (the step in flight at a move may be committed by some
#               ranks only), worlds 6 -> 4 -> 6, each restored commit the newest one, the reset
#               callbacks saw sizes 4 and 6, all 6 final ranks hold the same parameters, and rank
#               0's parameters after every step follow a one-process replay of the same steps with
#               the gradients averaged over that step's world at lr = base x world (within 1e-5).
#               Mutation (by hand): _in_place.regroup refusing a changed rank or size (as before
#               this scenario) -> the survivors raise, gzrun stops them: "survivor ... gone".
# Env: HB (heartbeat timeout, default 3 s), KEEP_LOGS=DIR; inplace, inplace2, inplacenode: MODEL (cnn or
# bert_small), BERT_LINES (1024), ZERO (a zero_stage); inplace, inplacenode: HOSTS; pynode: PY_STEPS (200), PY_STEP_SLEEP
# (0.1 s). Exit 77 (skip) without namespaces.
set -uo pipefail
[ $# = 7 ] || { echo "usage: multihost_elastic.sh CLUSTER_SH GZRUN TEST_WORKER GZ_TRAIN CONFIG CHECKER SCENARIO" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3 gztrain=$4 config=$5 checker=$6 scenario=$7
for f in "$cluster" "$gzrun" "$worker" "$checker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?

hb=${HB:-3}
log_level=warn
case $scenario in snapshot|zero3|inplace|inplace2|inplacenode|pynode) log_level=info ;; esac  # the restores' and resumes' lines
bound_ms=$(((hb + 2) * 1000))
port=29500
case $scenario in
  resize|snapshot|zero3|inplace|inplace2|inplacenode)
    [ -x "$gztrain" ] || { echo "SKIP: gz-train not built ($gztrain)"; exit 77; }
    [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
      { echo "SKIP: Fashion-MNIST not installed (dataset-fashion-mnist)"; exit 77; }
    hosts=3
    case $scenario in inplace|inplacenode) hosts=${HOSTS:-4} ;; esac ;;
  belowmin) hosts=2 ;;
  ghost) hosts=3 ;;
  pynode)
    [ -f "${PY_WORKER:-}" ] && [ -f "${PY_PATH:-}/guozhuang/__init__.py" ] ||
      { echo "SKIP: PY_WORKER ($PY_WORKER) or the built package under PY_PATH ($PY_PATH) missing"; exit 77; }
    /usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "SKIP: /usr/bin/python3 has no torch"; exit 77; }
    hosts=3 ;;
  *) echo "FAIL: unknown scenario '$scenario'"; exit 2 ;;
esac

id=el$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
starts=0
fail() {
  for f in "$dir"/"${log_prefix:-host}"*.log; do
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
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/*host*.log "$KEEP_LOGS"/ 2>/dev/null
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
# nproc, max_restarts, nnodes and gzrun_args (an array) change the gzrun options; port the store's
# port; log_prefix the log's name ($dir/${log_prefix:-host}$1.log, also in_log's and fail's).
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
      >>"$dir/${log_prefix:-host}$i.log" 2>&1
    echo $? >"$dir/rc_$i.$k.tmp" && mv "$dir/rc_$i.$k.tmp" "$dir/rc_$i.$k"  # whole or absent
  ) 2>/dev/null &  # no "Killed" notices from this shell: the test kills gzruns on purpose
}
wait_for() {  # SECONDS DESCRIPTION COMMAND...: poll every 50 ms
  local secs=$1 limit=$(($1 * 20)) what=$2
  shift 2
  for ((t = 0; t < limit; ++t)); do "$@" && return 0; sleep 0.05; done
  fail "timed out ($secs s) waiting for: $what"
}
in_log() { grep -q "$2" "$dir/${log_prefix:-host}$1.log" 2>/dev/null; }
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
# inplace, inplace2, inplacenode: the model (MODEL: cnn, CONFIG's Fashion-MNIST; or bert_small on
# generated text lines, BERT_LINES of them, 1,024 by default: 16 steps an epoch at world 8).
# Sets model_args (gz-train's arguments after --config), data_size and rank_batch.
case ${MODEL:-cnn} in
  cnn) model_args=() data_size=4800 rank_batch=32 ;;
  bert_small)
    . "$(dirname "$0")/../../bench/lib/stats.sh"  # text_lines: the benchmarks' generated text
    text_lines "$dir/text"
    data_size=${BERT_LINES:-1024} rank_batch=8
    model_args=(--dataset text_lines --train_data "$dir/text/train.tsv" --test_data "$dir/text/test.tsv"
                --train_limit "$data_size" --net_type bert_small --input_size 64 --num_classes 4
                --batch_size $rank_batch --eval_batch_size 64 --test_limit 200 --num_threads 1) ;;
  *) fail "unknown MODEL '$MODEL' (cnn or bert_small)" ;;
esac
# ZERO=1|2|3: the same at that ZeRO stage (shard snapshots with a buddy on the next node).
[ -n "${ZERO:-}" ] && model_args+=(--zero_stage "$ZERO")

if [ "$scenario" = inplace ] || [ "$scenario" = inplace2 ]; then
  # Batch 32 a rank: 4800 / (32 x world) steps an epoch (25 at world 6, 18 at world 8); the kill
  # lands mid-epoch 1 (not at an epoch's end, whose step has no snapshot). A victim is named by its host, whatever node rank the
  # rendezvous gives that host (by first arrival): only the victims' gzruns have
  # GZ_TRAIN_KILL_AT_STEP, and the wrapper names their local rank KILL_LOCAL (default 1) as
  # gz-train's crash rank (exec: no process in between). Global rank 0 is never a victim (it
  # reports the recovery): KILL_LOCAL=0 on node 0 kills that node's local rank 1.
  # inplace2 kills both victims as the same step begins, not 1 step apart: two losses in one
  # recovery (the survivors meet both replacements in one generation) is the case a single-loss
  # test does not cover; 2 kills in 2 steps would be 2 recoveries of the kind `inplace` tests.
  epochs=2 world=$((hosts * 2)) all_hosts=$(seq 0 $((hosts - 1)))
  kill_step=$((data_size / (rank_batch * world) * 3 / 2))
  nproc=2 max_restarts=1 gzrun_args=(--recovery in-place) nnodes=2:$hosts
  kill_hosts=(1)
  kill_env=([1]="KILL_LOCAL=1")
  [ "$scenario" = inplace2 ] && kill_hosts=(1 2) kill_env[2]="KILL_LOCAL=0"
  train_program() {  # WORK_DIR
    program=(sh -c 'r=$((NODE_RANK * LOCAL_WORLD_SIZE + ${KILL_LOCAL:-1})); [ "$r" = 0 ] && r=1
                    GZ_TRAIN_CRASH_RANK=$r exec "$0" "$@"' "$gztrain"
             --config "$config" ${model_args[@]+"${model_args[@]}"} --work_dir "$1" --num_epochs $epochs
             --snapshot_every 1 --save_steps 0 --resume_from_checkpoint auto --log_samples true)
  }
  accuracy_of() {  # LOG_GLOB...: rank 0's final test accuracy of a run of the whole world
    grep -h "final: test_accuracy=[0-9.]* .* world=$world " "$@" 2>/dev/null | tail -n 1 |
      sed -n 's/.*final: test_accuracy=\([0-9.]*\) .*/\1/p'
  }
  # (0) The reference: the same job uninterrupted (no kill), on its own port, logs and work_dir.
  train_program "$dir/ref"
  saved_port=$port port=$((port + 1)) log_prefix=ref_host
  t_ref=$(now_ns)
  rks=()
  for i in $all_hosts; do start_node $i; rks+=("$k"); done
  for i in $all_hosts; do wait_for 60 "reference: host $i in round 0 with $hosts nodes" in_log $i "elastic round 0: node . of $hosts"; done
  for i in $all_hosts; do wait_for 120 "reference: host $i's gzrun to finish" test -f "$dir/rc_$i.${rks[$i]}"; done
  ref_ms=$(ms_since "$t_ref")
  for i in $all_hosts; do
    [ "$(cat "$dir/rc_$i.${rks[$i]}")" = 0 ] || fail "reference: host $i's gzrun exited $(cat "$dir/rc_$i.${rks[$i]}")"
  done
  ! grep -q 'recovering in place\|replacing it in place\|restarting all\|elastic round 1' "$dir"/ref_host*.log ||
    fail "the reference run was interrupted"
  ref_acc=$(accuracy_of "$dir"/ref_host*.log)
  [ -n "$ref_acc" ] || fail "reference: no final evaluation line of world $world"
  port=$saved_port log_prefix=host

  train_program "$dir/work"
  t_start=$(now_ns)
  ks=()
  for i in $all_hosts; do
    if [ -n "${kill_env[$i]:-}" ]; then start_node $i GZ_TRAIN_KILL_AT_STEP=$kill_step "${kill_env[$i]}"; else start_node $i; fi
    ks+=("$k")
  done
  for i in $all_hosts; do wait_for 60 "host $i in round 0 with $hosts nodes" in_log $i "elastic round 0: node . of $hosts"; done
  wait_for 90 "round 0 to train 3 steps" rank0_steps 3
  declare -A host_of
  workers=""
  for i in $all_hosts; do
    for p in $(pgrep -P "$(cat "$dir/gzpid_$i.${ks[$i]}")"); do host_of[$p]=$i; workers+=" $p"; done
  done
  [ "${#host_of[@]}" = "$world" ] || fail "expected $world workers ($hosts hosts x 2), found ${#host_of[@]}:$workers"
  dead=()
  n_dead() {  # at least $1 of the workers are gone (in dead)
    dead=()
    for p in $workers; do kill -0 "$p" 2>/dev/null || dead+=("$p"); done
    [ "${#dead[@]}" -ge "$1" ]
  }
  wait_for 120 "a worker to be SIGKILLed at step $kill_step" n_dead 1
  t0=$(now_ns)
  [ "${host_of[${dead[0]}]}" = 1 ] || [ "$scenario" = inplace2 ] ||
    fail "the first worker lost (pid ${dead[0]}) ran on host ${host_of[${dead[0]}]}, not 1"
  # inplace2: the other victim dies as the same step begins (or, should it have failed step
  # kill_step - 1 with the survivors, once that step is redone: a second recovery).
  wait_for 60 "${#kill_hosts[@]} worker(s) SIGKILLed" n_dead ${#kill_hosts[@]}
  victim_hosts=$(for v in "${dead[@]}"; do echo "${host_of[$v]}"; done | sort | tr '\n' ' ')
  [ "$victim_hosts" = "${kill_hosts[*]} " ] ||
    fail "workers lost: pids ${dead[*]} on hosts $victim_hosts; expected one on each of hosts ${kill_hosts[*]}"
  # Whichever way the job goes on: in place (the survivors' rank 0), or a job-wide restart.
  wait_for 60 "the job to recover" any_log 'recovered in place at step\|restarting all\|giving up'
  recover_ms=$(ms_since "$t0")
  # (2) Each victim's host replaced its worker alone; no host restarted its workers, no node left.
  for i in $all_hosts; do
    ! in_log $i 'restarting all' ||
      fail "host $i restarted the job: $(grep -h 'restarting all' "$dir/host$i.log")"
    ! in_log $i 'job failure in round' ||
      fail "host $i saw a job failure: $(grep -h 'job failure' "$dir/host$i.log")"
  done
  vranks=()
  for v in "${dead[@]}"; do
    h=${host_of[$v]}
    wait_for 30 "host $h to replace its worker (pid $v) in place" \
      in_log "$h" "(pid $v) .*; replacing it in place (replacement 1 of 1): the other workers keep running"
    vr=$(grep -h "(pid $v) .*replacing it in place" "$dir/host$h.log" |
      sed -n 's/.*gzrun: rank \([0-9]*\) (pid.*/\1/p' | head -n 1)
    [ -n "$vr" ] || fail "host $h's gzrun does not name the victim's rank (pid $v)"
    vranks+=("$vr")
  done
  for i in $all_hosts; do
    [[ " ${kill_hosts[*]} " == *" $i "* ]] && continue
    ! in_log $i 'replacing it in place' || fail "host $i replaced a worker too"
  done
  for i in "${kill_hosts[@]}"; do
    n=$(grep -c 'replacing it in place' "$dir/host$i.log")
    [ "$n" = 1 ] || fail "host $i replaced $n workers, expected 1"
  done
  # (3) The survivors kept their process and recovered in place; rank 0 says when and from what.
  for p in $workers; do
    [[ " ${dead[*]} " == *" $p "* ]] || kill -0 "$p" 2>/dev/null ||
      fail "survivor pid $p (host ${host_of[$p]}) is gone: a survivor was stopped"
  done
  for r in $(seq 0 $((world - 1))); do
    [[ " ${vranks[*]} " == *" $r "* ]] && continue
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
  for i in $all_hosts; do wait_for 120 "host $i's gzrun to finish" test -f "$dir/rc_$i.${ks[$i]}"; done
  total_ms=$(ms_since "$t_start")
  for i in $all_hosts; do
    [ "$(cat "$dir/rc_$i.${ks[$i]}")" = 0 ] || fail "host $i's gzrun exited $(cat "$dir/rc_$i.${ks[$i]}")"
  done
  ! any_log 'restarting all\|elastic round 1' || fail "a job-wide restart or new round after the recovery"
  # Rank 0's recoveries: 1, or (inplace2) 2 when the second victim failed step kill_step - 1 with
  # the survivors and died only once that step was redone.
  recoveries=$(grep -h 'recovered in place at step' "$dir"/host*.log | wc -l)
  recs=$(grep -h 'recovered in place at step' "$dir"/host*.log | sed 's/.*recovered in place/recovered/' | tr '\n' ';')
  [ "$recoveries" -le "${#kill_hosts[@]}" ] || fail "rank 0 recovered $recoveries times: $recs"
  acc=$(accuracy_of "$dir"/host*.log)
  [ -n "$acc" ] || fail "no final evaluation line of world $world"
  # (5) Accuracy within 0.005 of the uninterrupted run (the issue: within 0.5 points).
  awk -v a="$acc" -v b="$ref_acc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }' ||
    fail "final test accuracy $acc, the uninterrupted run's $ref_acc: more than 0.005 apart"
  # (4) Every sample once an epoch over both sessions (before and after the recovery, the same world),
  # every step the reference's samples, at most the step of the snapshot not yet written redone
  # (per recovery).
  worlds=(); [ "$recoveries" = 1 ] && worlds=(--worlds $world,$world)  # 2 recoveries: 2 or 3 sessions count
  audit=$(/usr/bin/python3 "$checker" "$dir/work" --dataset-size $data_size --epochs $epochs "${worlds[@]}" \
    --reference "$dir/ref" 2>&1) || fail "$audit"
  redone=$(echo "$audit" | sed -n 's/.*; \([0-9]*\) step(s) run twice.*/\1/p')
  [ -n "$redone" ] && [ "$redone" -le "$recoveries" ] ||
    fail "${redone:-?} steps redone after $recoveries in-place recovery(ies) (at most 1 each): $audit"
  victims_text=""
  for j in "${!dead[@]}"; do victims_text+="rank ${vranks[$j]} (host ${host_of[${dead[$j]}]}) "; done
  echo "PASS: $scenario: $hosts hosts x 2 ranks, ${victims_text}SIGKILLed at step $kill_step: each replaced in place" \
    "by its host (no restart, no new round), the $((world - ${#dead[@]})) others kept their process; rank 0: $recs" \
    "$recover_ms ms after the first kill was seen -> finished in $total_ms ms; test_accuracy $acc, uninterrupted" \
    "run's $ref_acc (${ref_ms} ms); $audit"
  exit 0
fi

if [ "$scenario" = pynode ]; then
  # 200 steps with a 0.1 s pause each: the job outlives the loss (~HB + 1 s) and the return. A
  # shorter pause (PY_STEP_SLEEP, with more PY_STEPS) makes the kill land inside a step more often.
  steps=${PY_STEPS:-200} nproc=2 max_restarts=1 gzrun_args=(--recovery in-place) nnodes=2:3
  program=(/usr/bin/python3 "$PY_WORKER" "$steps" 0)
  penv=(PYTHONPATH="$PY_PATH" GZ_TEST_STEP_SLEEP="${PY_STEP_SLEEP:-0.1}" OMP_NUM_THREADS=1)
  commits() {  # SIZE MIN: some rank committed a step >= MIN on a world of SIZE
    grep -h -o "COMMIT [0-9]* [0-9]* $1 " "$dir"/host*.log 2>/dev/null |
      awk -v m="$2" '$2 >= m { f = 1 } END { exit !f }'
  }
  lines() { grep -h "$1" "$dir"/host*.log 2>/dev/null | wc -l; }  # PATTERN: how many log lines
  t_start=$(now_ns)
  ks=()
  for i in 0 1 2; do start_node $i "${penv[@]}"; ks+=("$k"); done
  for i in 0 1 2; do wait_for 60 "host $i in round 0 with 3 nodes" in_log $i 'elastic round 0: node . of 3'; done
  wait_for 90 "round 0 to commit 15 steps" commits 6 15
  survivors=$(for i in 0 1; do pgrep -P "$(cat "$dir/gzpid_$i.${ks[$i]}")"; done | tr '\n' ' ')
  [ "$(echo $survivors | wc -w)" = 4 ] || fail "expected 4 workers on hosts 0 and 1, found: $survivors"
  victim=$(cat "$dir/gzpid_2.${ks[2]}")
  lost=$(pgrep -P "$victim" | tr '\n' ',')
  t0=$(now_ns)
  kill -9 "$victim" $(pgrep -P "$victim")
  "${C[@]}" run 2 sh -c 'rm -rf /dev/shm/gz-elastic-*'  # the node is gone, its commits too
  for i in 0 1; do wait_for 30 "host $i to move to round 1" in_log $i 'elastic round 1: node . of 2'; done
  wait_for 30 "the 4 survivors to continue as ranks of 4" \
    bash -c "[ \$(grep -h 'continues as rank [0-9] of 4\$' '$dir'/host*.log | wc -l) -ge 4 ]"
  recover_ms=$(ms_since "$t0")
  wait_for 30 "the new rank 0 to report its recovery" any_log 'recovered in place at commit'
  rec_line=$(grep -h 'recovered in place at commit' "$dir"/host*.log | head -n 1)
  # Issue 22's target is detection + 3 s (measured 4.1-4.4 s with hb 3 and the 1 s join window);
  # the bound gives a loaded CI machine one second more.
  bound=$(((hb + 5) * 1000))
  [ "$recover_ms" -le "$bound" ] || fail "the survivors continued $recover_ms ms after the kill (bound $bound ms)"
  for i in 0 1; do
    in_log $i 'moving the local workers to the next round in place' || fail "host $i did not move its workers"
    ! in_log $i 'restarting all\|stopping the local workers' ||
      fail "host $i stopped its workers: $(grep -h 'restarting all\|stopping the local' "$dir/host$i.log")"
  done
  gone_ones=""
  for p in $survivors; do kill -0 "$p" 2>/dev/null || gone_ones+=" $p"; done
  [ -z "$gone_ones" ] || fail "survivor worker(s)$gone_ones are gone after the loss: stopped or failed"
  # Round 1 trains on 4 ranks for a while, then host 2 comes back (an empty /dev/shm).
  wait_for 30 "a step committed on 4 ranks" commits 4 0
  first4=$(grep -h -o 'COMMIT [0-9]* [0-9]* 4 ' "$dir"/host*.log | awk '{print $2}' | sort -n | head -n 1)
  wait_for 60 "round 1 to commit 10 steps on 4 ranks" commits 4 $((first4 + 10))
  t1=$(now_ns)
  start_node 2 "${penv[@]}"; ks[2]=$k
  for i in 0 1 2; do wait_for 30 "host $i in round 2 with 3 nodes" in_log $i 'elastic round 2: node . of 3'; done
  wait_for 60 "the 4 survivors to continue as ranks of 6" \
    bash -c "[ \$(grep -h 'of 4 continues as rank [0-9] of 6\$' '$dir'/host*.log | wc -l) -ge 4 ]"
  wait_for 60 "the admitted world to commit" commits 6 "$(
    grep -h -o 'COMMIT [0-9]* [0-9]* 4 ' "$dir"/host*.log | awk '{print $2}' | sort -n | tail -n 1)"
  admit_ms=$(ms_since "$t1")
  # Every node writes the new world's commits again (one writer per node, the returning one too).
  wait_for 10 "rank 0 to report the admission's restore" bash -c "[ \$(grep -h 'restored commit' '$dir'/host*.log | wc -l) -ge 2 ]"
  admitted=$(grep -h 'restored commit' "$dir"/host*.log | tail -n 1 | sed -n 's/.*restored commit \([0-9]*\) .*/\1/p')
  node_has_newer() {  # HOST: its /dev/shm holds a commit newer than the admission's restore
    "${C[@]}" run "$1" sh -c 'ls /dev/shm/gz-elastic-*/*/ 2>/dev/null' |
      sed -n 's/^commit-\([0-9]*\)\.pt$/\1/p' | awk -v a="$admitted" '$1 > a { f = 1 } END { exit !f }'
  }
  for i in 0 1 2; do wait_for 10 "host $i to write a commit after $admitted" node_has_newer $i; done
  gone_ones=""
  for p in $survivors; do kill -0 "$p" 2>/dev/null || gone_ones+=" $p"; done
  [ -z "$gone_ones" ] || fail "survivor worker(s)$gone_ones are gone after the admission"
  for i in 0 1 2; do wait_for 120 "host $i's gzrun to finish" test -f "$dir/rc_$i.${ks[$i]}"; done
  total_ms=$(ms_since "$t_start")
  for i in 0 1 2; do
    [ "$(cat "$dir/rc_$i.${ks[$i]}")" = 0 ] || fail "host $i's gzrun exited $(cat "$dir/rc_$i.${ks[$i]}")"
  done
  ! any_log 'restarting all' || fail "a job-wide restart: $(grep -h 'restarting all' "$dir"/host*.log)"
  for i in 0 1; do
    n=$(grep -c 'moving the local workers to the next round in place' "$dir/host$i.log")
    [ "$n" = 2 ] || fail "host $i moved its workers $n times, expected 2 (the loss, the admission)"
  done
  [ "$(lines 'of 6 continues as rank [0-9] of 4$')" = 4 ] && [ "$(lines 'of 4 continues as rank [0-9] of 6$')" = 4 ] ||
    fail "expected 4 moves 6 -> 4 and 4 moves 4 -> 6: $(grep -h 'continues as rank' "$dir"/host*.log)"
  # The commits across the job's history (the logs of both host 2 instances included).
  audit=$(grep -h -o 'COMMIT [0-9]* [0-9]* [0-9]* [0-9]*\|restored commit [0-9]* (from rank [0-9]*.s [a-z]*)\|RESET [0-9]* [0-9]* [0-9.]*\|PARAMS [0-9]* [0-9a-f]*\|PSUM [0-9]* [0-9.e+-]* [0-9]*' \
    "$dir"/host*.log | /usr/bin/python3 -c '
import subprocess
import sys
from collections import defaultdict
steps, want, lost = defaultdict(list), int(sys.argv[1]), {int(p) for p in sys.argv[2].split(",") if p}
by_pid, restored, resets, params, commits, psums = defaultdict(list), [], defaultdict(list), [], [], []
for line in sys.stdin:
    w = line.split()
    if w[0] == "COMMIT":
        commits.append(tuple(map(int, w[1:])))
    elif w[0] == "restored":
        restored.append((int(w[2]), w[-1].rstrip(")")))
    elif w[0] == "PSUM":
        psums.append((int(w[1]), float(w[2]), int(w[3])))
    elif w[0] == "RESET":
        resets[int(w[2])].append(float(w[3]))
    else:
        params.append(w[2])
def die(msg):
    sys.exit(msg)
if not restored:
    die("no restored commit")
for s, r, n, p in commits:  # a commit the lost node alone made (killed before the others) died with it
    if p not in lost or s <= restored[0][0] + 1:
        steps[s].append((r, n))
        by_pid[p].append(s)
if sorted(steps) != list(range(1, want + 1)):
    die(f"steps committed: {sorted(steps)[:5]}..., expected 1..{want}: some never committed")
for p, ss in by_pid.items():
    if ss != sorted(set(ss)):
        die(f"pid {p} committed a step twice or out of order: {ss}")
world = {s: {n for _, n in steps[s]} for s in steps}
bad = [s for s in steps if len(world[s]) != 1]
if bad:
    die(f"step {bad[0]} committed on worlds {sorted(world[bad[0]])}: redone after a move")
seq = [world[s].pop() for s in range(1, want + 1)]
segments = [seq[0]] + [b for a, b in zip(seq, seq[1:]) if a != b]
if segments != [6, 4, 6]:
    die(f"worlds over the steps: {segments}, expected 6 -> 4 -> 6")
ends = [s for s in range(1, want) if seq[s - 1] != seq[s]]  # last step of a world
for s in range(1, want + 1):
    ranks = sorted(r for r, _ in steps[s])
    n = seq[s - 1]
    if len(ranks) != len(set(ranks)) or any(r >= n for r in ranks):
        die(f"step {s} (world {n}) committed by ranks {ranks}")
    if len(ranks) != n and s not in ends:  # only the step in flight at a move may be partial
        die(f"step {s} committed by {len(ranks)} of {n} ranks")
got = [c + 1 for c, _ in restored]  # commit c holds step c + 1
if got != ends or any(src != "memory" for _, src in restored):
    die(f"restored {restored}: expected the commits of steps {ends} (the newest), from a survivor memory")
if sorted(len(v) for v in resets.values()) != [4, 6] or set(resets) != {4, 6}:
    die(f"reset callbacks per world size: { {k: len(v) for k, v in resets.items()} }, expected 4 at size 4, 6 at 6")
if any(abs(lr - 0.05 / 3 * n) > 1e-6 for n, v in resets.items() for lr in v):
    die(f"reset callbacks set lr {dict(resets)}: expected base x size")
if len(params) != 6 or len(set(params)) != 1:
    die(f"final parameters of {len(params)} ranks, {len(set(params))} distinct (expected 6 equal)")
# The same steps in one process, each averaged over its world (elastic_in_place.py replay): rank
# 0 parameter sums must follow it (float rounding differs with the reduction order: 1e-5).
job = {s: v for s, v, p in psums if p not in lost or s <= restored[0][0] + 1}
out = subprocess.run([sys.executable, sys.argv[3], "replay", ",".join(map(str, seq))], capture_output=True,
                     text=True, check=True).stdout
ref = {int(w[1]): float(w[2]) for w in (line.split() for line in out.splitlines())}
off = [(s, job[s], ref[s]) for s in sorted(job) if abs(job[s] - ref[s]) > 1e-5 * abs(ref[s])]
if off or len(job) < want - 2:
    die(f"rank 0 parameter sums differ from a replay of the worlds {segments} at {len(off)} step(s), "
        f"first (step, job, replay): {off[:1]}; {len(job)} of {want} steps reported")
dev = max(abs(job[s] - ref[s]) / abs(ref[s]) for s in job)
print(f"{want} steps each committed on one world (6 -> 4 -> 6, the last before each move at step(s) {ends}), "
      f"restored commits {[c for c, _ in restored]} from memory, resets at sizes 4 and 6, 6 ranks end equal, "
      f"rank 0 parameter sums within {dev:.1e} of a one-process replay of those worlds")
' $steps "$lost" "$PY_WORKER" 2>&1) || fail "$audit"
  echo "PASS: pynode: 3 hosts x 2 Python ranks, host 2 lost whole: the 4 survivors kept their pids and continued" \
    "as ranks of 4 $recover_ms ms after the kill (bound $bound ms; ${rec_line##*] }); host 2 back: admitted in" \
    "place $admit_ms ms after its gzrun started (survivors kept their pids, world 6); finished in $total_ms ms; $audit"
  exit 0
fi

if [ "$scenario" = inplacenode ]; then
  # RECOVERY=restart: the same job and fault under gzrun's restart path, for the before/after
  # comparison in docs/reliability.md: it reports when the restarted workers restored the snapshot
  # and fails (the in-place assertions cannot hold); also the scenario's mutation check.
  recovery=${RECOVERY:-in-place}
  epochs=2 nproc=2 max_restarts=1 gzrun_args=(--recovery "$recovery") nnodes=$((hosts - 1)):$hosts
  last=$((hosts - 1)) world=$((2 * hosts)) small=$((2 * hosts - 2))
  all_hosts=$(seq 0 $last) kept_hosts=$(seq 0 $((last - 1)))
  train_args() { echo --config "$config" "${model_args[@]}" --work_dir "$1" --num_epochs $epochs --snapshot_every 1 \
    --save_steps 0 --resume_from_checkpoint auto --log_samples true; }
  accuracy_of() {  # LOG_GLOB...: rank 0's final test accuracy of a full-world run
    grep -h "final: test_accuracy=[0-9.]* .* world=$world " "$@" 2>/dev/null | tail -n 1 |
      sed -n 's/.*final: test_accuracy=\([0-9.]*\) .*/\1/p'
  }
  # (0) The reference: the same job uninterrupted, on its own port, logs and work_dir.
  read -r -a targs <<<"$(train_args "$dir/ref")"
  program=("$gztrain" "${targs[@]}")
  saved_port=$port port=$((port + 1)) log_prefix=ref_host
  rks=()
  for i in $all_hosts; do start_node $i; rks+=("$k"); done
  for i in $all_hosts; do wait_for 180 "reference: host $i's gzrun to finish" test -f "$dir/rc_$i.${rks[$i]}"; done
  for i in $all_hosts; do
    [ "$(cat "$dir/rc_$i.${rks[$i]}")" = 0 ] || fail "reference: host $i's gzrun exited $(cat "$dir/rc_$i.${rks[$i]}")"
  done
  ref_acc=$(accuracy_of "$dir"/ref_host*.log)
  [ -n "$ref_acc" ] || fail "reference: no final evaluation line of world $world"
  port=$saved_port log_prefix=host

  read -r -a targs <<<"$(train_args "$dir/work")"
  program=("$gztrain" "${targs[@]}")
  t_start=$(now_ns)
  ks=()
  for i in $all_hosts; do start_node $i; ks+=("$k"); done
  for i in $all_hosts; do wait_for 60 "host $i in round 0 with $hosts nodes" in_log $i "elastic round 0: node . of $hosts"; done
  wait_for 90 "round 0 to train 12 steps" rank0_steps 12
  survivors=$(for i in $kept_hosts; do pgrep -P "$(cat "$dir/gzpid_$i.${ks[$i]}")"; done | tr '\n' ' ')
  [ "$(echo $survivors | wc -w)" = $small ] || fail "expected $small workers on the hosts kept, found: $survivors"
  victim=$(cat "$dir/gzpid_$last.${ks[$last]}")
  # Host 2 is node 0 when it arrived first: rank 0 would be lost with it, and the survivors'
  # recovery line comes from the new rank 0 (a survivor), which the checks below read alike.
  t0=$(now_ns)
  kill -9 "$victim" $(pgrep -P "$victim")
  "${C[@]}" run $last sh -c 'rm -rf /dev/shm/gz-snapshots-*'  # the node is gone
  if [ "$recovery" = restart ]; then
    wait_for 60 "the restarted workers to restore the snapshot" any_log 'restored the snapshot of step'
    fail "restart mode (measurement): the restarted workers restored the snapshot $(ms_since "$t0") ms after the kill"
  fi
  for i in $kept_hosts; do
    wait_for 30 "host $i to move to round 1 in place" in_log $i "elastic round 1: node . of $last"
  done
  wait_for 30 "the survivors to recover in place" any_log 'recovered in place at step'
  recover_ms=$(ms_since "$t0")
  line=$(grep -h 'recovered in place at step' "$dir"/host*.log | head -n 1)
  echo "$line" | grep -q '(snapshot)' || fail "the survivors did not recover from a snapshot: $line"
  # Issue 22's target is detection + 3 s (measured 4.3-4.9 s here with hb 3 and the 1 s join
  # window); the bound gives a loaded CI machine one second more.
  bound=$(((hb + 5) * 1000))
  [ "$recover_ms" -le "$bound" ] || fail "recovered $recover_ms ms after the kill (bound $bound ms): $line"
  for i in $kept_hosts; do
    in_log $i 'moving the local workers to the next round in place' || fail "host $i did not move its workers"
    ! in_log $i 'restarting all\|stopping the local workers' ||
      fail "host $i stopped its workers: $(grep -h 'restarting all\|stopping the local' "$dir/host$i.log")"
  done
  gone_ones=""
  for p in $survivors; do kill -0 "$p" 2>/dev/null || gone_ones+=" $p"; done
  [ -z "$gone_ones" ] || fail "survivor worker(s)$gone_ones are gone: they were stopped or died"
  any_log "continues as rank [0-9]* of $small\$" || fail "no survivor took its rank in the $small-rank world"
  # Round 1 trains on 4 ranks for a while, then host 2 comes back with an empty /dev/shm.
  wait_for 60 "round 1 to train 2 steps" rank0_steps 2  # the newest session: round 1's
  t1=$(now_ns)
  start_node $last; kb=$k
  for i in $all_hosts; do wait_for 30 "host $i in round 2 with $hosts nodes" in_log $i "elastic round 2: node . of $hosts"; done
  wait_for 60 "the survivors to recover again (admission)" \
    bash -c "[ \$(grep -h 'recovered in place at step' '$dir'/host*.log | wc -l) -ge 2 ]"
  admit_ms=$(ms_since "$t1")
  # The returning node's state: the snapshot, sent by a peer over the network; or, when the move
  # lands right after an epoch's end (which takes no snapshot), that epoch's disk checkpoint.
  # (ZERO: the old world's shards, resharded, each sent by a rank that holds it.)
  how="the snapshot over the network" sent='restored the snapshot of step .* sent by rank'
  [ -n "${ZERO:-}" ] && how="the shard snapshot resharded over the network" sent="snapshot of step .* resharded to $world"
  if ! any_log "$sent"; then
    any_log 'recovered in place at step .* (checkpoint)' ||
      fail "the returning node did not get the snapshot over the network (nor a newer checkpoint)"
    how="the epoch end's disk checkpoint (newer than any snapshot)"
  fi
  for p in $survivors; do kill -0 "$p" 2>/dev/null || fail "survivor $p is gone after the admission"; done
  ks[$last]=$kb
  for i in $all_hosts; do wait_for 120 "host $i's gzrun to finish" test -f "$dir/rc_$i.${ks[$i]}"; done
  total_ms=$(ms_since "$t_start")
  for f in $(for i in $all_hosts; do echo "rc_$i.${ks[$i]}"; done); do
    [ "$(cat "$dir/$f")" = 0 ] || fail "gzrun ($f) exited $(cat "$dir/$f")"
  done
  ! any_log 'restarting all' || fail "a job-wide restart: $(grep -h 'restarting all' "$dir"/host*.log)"
  acc=$(accuracy_of "$dir"/host*.log)
  [ -n "$acc" ] || fail "no final evaluation line of world $world"
  awk -v a="$acc" -v b="$ref_acc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.005) }' ||
    fail "final test accuracy $acc, the uninterrupted run's $ref_acc: more than 0.005 apart"
  audit=$(/usr/bin/python3 "$checker" "$dir/work" --dataset-size $data_size --epochs $epochs --worlds $world,$small,$world 2>&1) ||
    fail "$audit"
  redone=$(echo "$audit" | sed -n 's/.*; \([0-9]*\) step(s) run twice.*/\1/p')
  [ -n "$redone" ] && [ "$redone" -le 2 ] || fail "${redone:-?} steps redone over 2 moves (at most 1 each): $audit"
  recs=$(grep -h 'recovered in place at step' "$dir"/host*.log | sed 's/.*recovered in place/recovered/' | tr '\n' ';')
  echo "PASS: inplacenode: $hosts hosts x 2 ranks, host $last lost whole: the $small survivors kept their process" \
    "and continued as $small ranks $recover_ms ms after the kill (bound $bound ms); host $last back: admitted in place" \
    "$admit_ms ms after its gzrun started, restoring $how; rank 0: $recs finished in $total_ms ms; test_accuracy $acc," \
    "uninterrupted $ref_acc; $audit"
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
