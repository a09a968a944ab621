#!/usr/bin/env bash
# The flight recorder's fault matrix on a simulated cluster (scripts/cluster.sh): gzrun on 4 hosts
# x 2 ranks running flight_fault_worker (a training loop in miniature over the `auto` backend:
# shared memory within a host, Gloo across hosts), one fault per run with a random victim, and
# node 0's gzrun must print ONE verdict line naming the right rank (or node) and the right cause:
#   stop      SIGSTOP of one worker                 -> "rank V (node N) ... stopped"
#   skip      one worker leaves out one all-reduce  -> "rank V (node N) skipped a collective"
#   mismatch  one worker all-reduces twice the size -> "rank V (node N) called a mismatched collective"
#   killnode  SIGKILL of one host's gzrun + workers -> "node H (ranks ...) died"
#   link      one host's cable pulled               -> "node H (ranks ...) is cut off" / "the link of node H"
#   kill      SIGKILL of one worker                 -> "rank V (node N) died (killed by signal 9 ...)"
#   hang      one worker hangs in data loading      -> "rank V (node N) has not entered ...; step S, phase data, T s"
#   status    SIGSTOP of one worker, then `gzrun --status` from host 0 while the job still runs
#             (op deadline 60 s)                    -> "rank V (node N) ... stopped"
#   flight_faults.sh CLUSTER_SH GZRUN WORKER SCENARIO [RUNS]
# SCENARIO may be "all". Prints one PASS/FAIL line per run and "RESULT flight_faults <scenario>
# correct=C runs=R"; exits 0 when every run named the right culprit. Env: KEEP_LOGS=DIR (failed
# runs' logs and dumps; every run's with KEEP_ALL=1), SEED.
# Exit 77 (skipped) without namespaces.
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: flight_faults.sh CLUSTER_SH GZRUN WORKER SCENARIO [RUNS]" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3 scenario=$4 runs=${5:-1}
for f in "$cluster" "$gzrun" "$worker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?
scenarios=$scenario
[ "$scenario" = all ] && scenarios="stop skip mismatch killnode link kill hang status"
for s in $scenarios; do
  case $s in stop | skip | mismatch | killnode | link | kill | hang | status) ;; *) echo "FAIL: unknown scenario '$s'"; exit 2 ;; esac
done
RANDOM=${SEED:-$$}

hosts=4 nproc=2 world=8 port=29600 hb=3
id=rec$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
cleanup_run() {
  for f in "$dir"/cur/gzpid_* "$dir"/cur/pid_*; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    kill -CONT "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
}
cleanup() {
  cleanup_run
  "${C[@]}" down
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up $hosts >/dev/null || exit $?
master=$("${C[@]}" ip 0)

# run_one SCENARIO K: one run with a random victim; prints PASS or FAIL; returns 0 on PASS.
run_one() {
  local s=$1 k=$2 rd="$dir/$1-$2" v=-1 h=-1 step=0 deadline=4 expect
  rm -f "$dir/cur" && mkdir -p "$rd" && ln -s "$rd" "$dir/cur"
  case $s in
    stop | skip | mismatch | kill | hang) v=$((RANDOM % world)) h=$((v / nproc)) ;;
    status) v=$((RANDOM % world)) h=$((v / nproc)) deadline=60 ;;
    killnode | link) h=$((1 + RANDOM % (hosts - 1))) deadline=10 ;;  # not host 0: it hosts the store
  esac
  step=$((3 + RANDOM % 5))
  local fault=""
  [ "$s" = skip ] || [ "$s" = mismatch ] || [ "$s" = hang ] && fault=$s
  for ((i = 0; i < hosts; ++i)); do
    (
      "${C[@]}" run "$i" env -u GZ_NODE_ID GZ_RDZV_TOKEN="rec-test-$$" GZ_TEST_FAULT="$fault" GZ_TEST_VICTIM=$v \
        GZ_TEST_FAULT_STEP=$step sh -c 'echo $$ >"$0"; exec "$@"' "$rd/gzpid_$i" \
        "$gzrun" --nnodes $hosts --node-rank "$i" --master-addr "$master" --master-port $port \
        --nproc-per-node $nproc --rdzv-timeout 60 --heartbeat-timeout $hb --grace-period 1 \
        --log-dir "$rd/logs" -- "$worker" "$rd" 1000000 "$deadline" >"$rd/host$i.log" 2>&1
      echo $? >"$rd/rc_$i"
    ) 2>/dev/null &
  done
  local t n=0
  for ((t = 0; t < 1200; ++t)); do
    n=$(ls "$rd"/pid_* 2>/dev/null | grep -vc '\.tmp$')
    [ "$n" = "$world" ] && break
    sleep 0.05
  done
  local t0=$SECONDS
  if [ "$n" != "$world" ] && [ -z "$fault" ]; then
    echo "FAIL: $s run $k: only $n of $world workers started"
    cleanup_run
    return 1
  fi
  sleep "0.$((2 + RANDOM % 6))"  # a random moment of the loop
  case $s in
    stop) kill -STOP "$(cat "$rd/pid_$v")" ;;
    killnode) kill -9 "$(cat "$rd/gzpid_$h")" "$(cat "$rd/pid_$((h * nproc))")" "$(cat "$rd/pid_$((h * nproc + 1))")" ;;
    link) "${C[@]}" link "$h" down ;;
    kill) kill -9 "$(cat "$rd/pid_$v")" ;;
    status)
      kill -STOP "$(cat "$rd/pid_$v")"
      sleep 2.5  # the others wait longer than --stuck (1 s)
      "${C[@]}" run 0 env GZ_RDZV_TOKEN="rec-test-$$" "$gzrun" --status --master-addr "$master" --master-port $port \
        >"$rd/status.log" 2>&1
      [ -f "$rd/rc_0" ] && echo "(the job ended before --status: it must still run)" >"$rd/status.log"
      ;;
  esac
  # Node 0's gzrun prints the verdict once the round failed.
  for ((t = 0; t < 900; ++t)); do
    [ -f "$rd/rc_0" ] || [ "$s" = status ] && break
    sleep 0.05
  done
  [ "$s" = link ] && "${C[@]}" link "$h" up
  cleanup_run
  for ((t = 0; t < 200; ++t)); do  # the other gzruns give up too (the store host is gone)
    [ "$(ls "$rd"/rc_* 2>/dev/null | wc -l)" -ge "$hosts" ] && break
    sleep 0.05
  done
  local verdict out="$rd/host0.log"
  [ "$s" = status ] && out="$rd/status.log"
  verdict=$(grep -m1 -o "verdict: .*" "$out")
  local r0=$((h * nproc)) r1=$((h * nproc + 1))
  case $s in
    stop) expect="^verdict: rank $v \(node $h\).* stopped" ;;
    skip) expect="^verdict: rank $v \(node $h\) skipped a collective" ;;
    mismatch) expect="^verdict: rank $v \(node $h\) called a mismatched collective" ;;
    killnode) expect="^verdict: node $h \(ranks $r0, $r1\) died" ;;
    link) expect="^verdict: (node $h \(ranks $r0, $r1\) is cut off|the link of node $h )" ;;
    kill) expect="^verdict: rank $v \(node $h\) died \(killed by signal 9" ;;
    hang) expect="^verdict: rank $v \(node $h\) has not entered .*; step $step, phase data" ;;
    status) expect="^verdict: rank $v \(node $h\).* stopped" ;;
  esac
  local what="rank $v (node $h)"
  [ "$v" -lt 0 ] && what="node $h"
  if [ -n "$verdict" ] && grep -Eq "$expect" <<<"$verdict"; then
    echo "PASS: $s run $k, victim $what, $((SECONDS - t0)) s: $verdict"
    [ -n "${KEEP_ALL:-}" ] && [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp -r "$rd" "$KEEP_LOGS"/
    return 0
  fi
  echo "FAIL: $s run $k, victim $what: ${verdict:-no verdict printed}"
  sed -n '/verdict:/,$p' "$out" | head -20
  tail -n 15 "$out"
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp -r "$rd" "$KEEP_LOGS"/
  return 1
}

status=0
for s in $scenarios; do
  ok=0
  for ((k = 1; k <= runs; ++k)); do
    run_one "$s" "$k" && ok=$((ok + 1))
    port=$((port + 10))  # a fresh port: the last run's sockets may linger
  done
  echo "RESULT flight_faults $s correct=$ok runs=$runs"
  [ "$ok" = "$runs" ] || status=1
done
exit $status
