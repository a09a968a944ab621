#!/usr/bin/env bash
# Job-wide failure handling of gzrun on a simulated cluster (scripts/cluster.sh): gzrun on every
# host, 2 workers each (gzrun_test_worker "job" mode: checkpoints every 100 ms), then one fault.
# Every gzrun must stop its workers within the bound (heartbeat timeout + 2 s, measured from the
# fault to gzrun's exit, so the workers are gone by then), name the node / rank / cause, and exit
# non-zero; or, for the restart scenario, restart together and finish. After a worker failure
# (a failure record in the store, not a silence) the bound is half the heartbeat timeout.
#
#   multihost_failures.sh CLUSTER_SH GZRUN WORKER SCENARIO
#     exit       3 hosts; rank 2 (host 1) exits 7 after 1.5 s
#     kill       3 hosts; SIGKILL of host 1's gzrun and its workers
#     link       2 hosts; host 1's cable pulled: host 0 loses node 1, host 1 loses the store host
#     stop       3 hosts; SIGSTOP of host 1's gzrun and its workers
#     storehost  2 hosts; SIGKILL of host 0's gzrun (the store host) and its workers
#     restart    2 hosts, --max-restarts 1; rank 2 fails once: both nodes restart in round 1,
#                every worker resumes from its checkpoint and the job completes
#     exhausted  2 hosts, --max-restarts 1; rank 2 fails in every round: all exit 1
# Env: HB (heartbeat timeout, default 3 s), KEEP_LOGS=DIR (copy the gzrun logs there). Exit 77 (skip) where the cluster cannot be built.
set -uo pipefail
[ $# = 4 ] || { echo "usage: multihost_failures.sh CLUSTER_SH GZRUN WORKER SCENARIO" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3 scenario=$4
for f in "$cluster" "$gzrun" "$worker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?

hb=${HB:-3}
# Several hosts: the store is beyond loopback, so every node needs the job's token.
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
bound_ms=$(((hb + 2) * 1000))
hosts=2 restarts=0 fail_rank=-1 fail_attempts=0 steps=500 port=29500
case $scenario in
  exit) hosts=3 fail_rank=2 fail_attempts=99 ;;
  kill | stop) hosts=3 ;;
  link | storehost) ;;
  restart) restarts=1 fail_rank=2 fail_attempts=1 steps=30 ;;
  exhausted) restarts=1 fail_rank=2 fail_attempts=99 ;;
  *) echo "FAIL: unknown scenario '$scenario'"; exit 2 ;;
esac

id=mf$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
pids=()
fail() {
  for f in "$dir"/host*.log; do
    echo "---- $(basename "$f") (last 30 lines)"
    tail -n 30 "$f"
  done
  echo "FAIL: $scenario: $*"
  exit 1
}
cleanup() {
  # Everything this test started: the gzruns (also stopped ones) and their workers.
  for f in "$dir"/gzrun_pid_* "$dir"/pid_*; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    kill -CONT "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  "${C[@]}" down
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/host*.log "$KEEP_LOGS"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up "$hosts" || exit $?
master=$("${C[@]}" ip 0)
world=$((hosts * 2))
now_ns() { date +%s%N; }

for ((i = 0; i < hosts; ++i)); do
  (
    "${C[@]}" run "$i" env -u GZ_NODE_ID sh -c 'echo $$ >"$0"; exec "$@"' "$dir/gzrun_pid_$i" \
      "$gzrun" --nnodes "$hosts" --node-rank "$i" --master-addr "$master" --master-port $port \
      --nproc-per-node 2 --rdzv-timeout 20 --heartbeat-timeout "$hb" --grace-period 1 --max-restarts $restarts \
      -- "$worker" job "$dir" $fail_rank 7 1.5 $steps $fail_attempts >"$dir/host$i.log" 2>&1
    echo $? >"$dir/rc_$i"
    now_ns >"$dir/end_$i.tmp" && mv "$dir/end_$i.tmp" "$dir/end_$i"  # whole or absent
  ) &
  pids+=($!)
done

# Running: every rank wrote its pid (and every gzrun its own).
for ((t = 0; t < 300; ++t)); do
  n=$(ls "$dir"/pid_* 2>/dev/null | grep -vc '\.tmp$')
  [ "$n" = "$world" ] && break
  sleep 0.05
done
[ "$n" = "$world" ] || fail "only $n of $world workers started"
sleep 0.5  # a few heartbeats

victims() {  # host H's gzrun and its workers
  echo "$(cat "$dir/gzrun_pid_$1") $(cat "$dir/pid_$((2 * $1))") $(cat "$dir/pid_$((2 * $1 + 1))")"
}
case $scenario in
  exit | restart | exhausted)
    for ((t = 0; t < 100; ++t)); do [ -f "$dir/failed_at" ] && break; sleep 0.05; done
    [ -f "$dir/failed_at" ] || fail "rank 2 did not fail"
    t0=$(cat "$dir/failed_at")
    ;;
  kill) t0=$(now_ns); kill -9 $(victims 1) ;;
  stop) t0=$(now_ns); kill -STOP $(victims 1) ;;
  storehost) t0=$(now_ns); kill -9 $(victims 0) ;;
  link) t0=$(now_ns); "${C[@]}" link 1 down ;;
esac

# Which gzruns must end, and what each must say.
watch=()
for ((i = 0; i < hosts; ++i)); do
  case $scenario in
    kill | stop) [ $i = 1 ] && continue ;;
    storehost) [ $i = 0 ] && continue ;;
  esac
  watch+=("$i")
done
for ((t = 0; t < 400; ++t)); do
  done_all=1
  for i in "${watch[@]}"; do [ -f "$dir/end_$i" ] || done_all=0; done
  [ $done_all = 1 ] && break
  sleep 0.05
done

# Exhausted: the bound counts from the last failure (round 1's; failed_at is rewritten then).
[ "$scenario" = exhausted ] && t0=$(cat "$dir/failed_at")
report=""
for i in "${watch[@]}"; do
  [ -f "$dir/end_$i" ] || fail "host $i: gzrun still running $(((($(now_ns) - t0)) / 1000000)) ms after the fault"
  rc=$(cat "$dir/rc_$i")
  ms=$((($(cat "$dir/end_$i") - t0) / 1000000))
  log=$dir/host$i.log
  report+=" host$i=${ms}ms"
  case $scenario in
    restart)
      [ "$rc" = 0 ] || fail "host $i: gzrun exited $rc, expected 0 after the job-wide restart"
      grep -q "restarting all nodes' workers (restart 1 of 1, job-wide round 1) after: node 1 (h1): rank 2" "$log" ||
        fail "host $i: no job-wide restart line"
      continue
      ;;
  esac
  [ "$rc" != 0 ] || fail "host $i: gzrun exited 0"
  [ "$ms" -le "$bound_ms" ] || fail "host $i: gzrun took $ms ms after the fault (bound $bound_ms ms)"
  # A failure record travels within a heartbeat interval: far below the heartbeat timeout (a
  # survivor that only noticed node 1's silence would take the whole timeout).
  case $scenario in
    exit | exhausted) [ "$ms" -le $((hb * 1000 / 2)) ] ||
      fail "host $i: gzrun took $ms ms after a worker failure (bound for a failure record: $((hb * 1000 / 2)) ms)" ;;
  esac
  case $scenario in
    exit)
      grep -q "job failure in round 0: node 1 (h1): rank 2 (local rank 0, pid [0-9]*) exited with code 7" "$log" ||
        fail "host $i: the failure (node 1, rank 2, exit code 7) is not named"
      ;;
    exhausted)
      grep -q "giving up after 1 job-wide restart(s); last failure: node 1 (h1): rank 2 .* exited with code 7" "$log" ||
        fail "host $i: no 'giving up' summary naming node 1 / rank 2 / code 7"
      grep -q "job failure in round 1: node 1 (h1): rank 2" "$log" || fail "host $i: round 1 failure not reported"
      ;;
    kill | stop)
      grep -q "job failure in round 0: node 1 lost: no heartbeat" "$log" || fail "host $i: node 1 not named as lost"
      ;;
    link)
      if [ "$i" = 0 ]; then
        grep -q "job failure in round 0: node 1 lost: no heartbeat" "$log" || fail "host 0: node 1 not named as lost"
      else
        grep -q "job failure in round 0: lost the store host (node 0 at $master:$((port + 1)))" "$log" ||
          fail "host 1: the lost store host is not reported"
      fi
      ;;
    storehost)
      grep -q "job failure in round 0: lost the store host (node 0 at $master:$((port + 1)))" "$log" ||
        fail "host $i: the lost store host is not reported"
      ;;
  esac
done

# The workers of every watched host are gone.
for i in "${watch[@]}"; do
  for r in $((2 * i)) $((2 * i + 1)); do
    p=$(cat "$dir/pid_$r")
    if kill -0 "$p" 2>/dev/null && ! grep -q '^[^)]*) Z' "/proc/$p/stat" 2>/dev/null; then
      fail "rank $r (pid $p) of host $i still runs"
    fi
  done
done

if [ "$scenario" = restart ]; then
  all=$(cat "$dir"/host*.log)
  for ((r = 0; r < world; ++r)); do
    line=$(grep -o "done rank=$r attempt=[0-9]* round=[0-9]* resumed_at=[0-9]*" <<<"$all") ||
      fail "rank $r did not finish"
    [[ $line == *"attempt=1 round=1 "* ]] || fail "rank $r finished in '$line', expected round 1"
    resumed=${line##*resumed_at=}
    [ "$resumed" -gt 0 ] || fail "rank $r did not resume from its checkpoint ($line)"
  done
  report+=" (every rank finished in round 1, resumed from its checkpoint)"
fi
echo "PASS: $scenario, $hosts hosts, heartbeat timeout ${hb} s, bound ${bound_ms} ms:$report"
