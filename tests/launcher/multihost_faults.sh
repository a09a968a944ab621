#!/usr/bin/env bash
# Node faults in the middle of all-reduces on a simulated cluster (scripts/cluster.sh): gzrun on 3
# hosts x 2 ranks, every rank all-reducing 256 KiB in a loop (gzrun_fault_worker: shared memory
# within a host, Gloo across hosts, each op with a DEADLINE of HB seconds), then one fault:
#   kill       SIGKILL of host 1's gzrun and workers
#   link       host 1's cable pulled (packets dropped silently)
#   stop       SIGSTOP of host 1's gzrun and workers (a hung node)
#   storehost  SIGKILL of host 0's gzrun (the store host) and workers
# Every survivor must raise or be stopped within DEADLINE + 2 s: each surviving worker either
# wrote raised_<rank> (its all-reduce failed) or was stopped by its gzrun, and each surviving gzrun
# has exited (code 1, naming the failure) by then. Prints each survivor's times.
#   multihost_faults.sh CLUSTER_SH GZRUN FAULT_WORKER SCENARIO
# Env: HB (heartbeat timeout = op deadline, default 3 s), KEEP_LOGS=DIR. Exit 77 without namespaces.
set -uo pipefail
[ $# = 4 ] || { echo "usage: multihost_faults.sh CLUSTER_SH GZRUN FAULT_WORKER SCENARIO" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3 scenario=$4
for f in "$cluster" "$gzrun" "$worker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?
case $scenario in kill | link | stop | storehost) ;; *) echo "FAIL: unknown scenario '$scenario'"; exit 2 ;; esac

hb=${HB:-3}
bound_ms=$(((hb + 2) * 1000))
hosts=3 port=29500 world=6
id=ef$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
fail() {
  for f in "$dir"/host*.log; do
    echo "---- $(basename "$f") (last 30 lines)"
    tail -n 30 "$f"
  done
  echo "FAIL: $scenario: $*"
  exit 1
}
cleanup() {
  for f in "$dir"/gzpid_* "$dir"/pid_*; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    kill -CONT "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
  "${C[@]}" down
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/host*.log "$KEEP_LOGS"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up $hosts || exit $?
master=$("${C[@]}" ip 0)
now_ns() { date +%s%N; }
# The bound below is on failure handling; the flight-recorder verdict that node 0 prints after a
# failure waits for the other nodes' reports (--verdict-wait, default 3 s) and is tested by
# flight_faults.sh: short waits here keep it from eating the bound (it did, 1 run in 2 under ctest -j2).

for ((i = 0; i < hosts; ++i)); do
  (
    "${C[@]}" run "$i" env -u GZ_NODE_ID GZ_RDZV_TOKEN="ef-test-$$" sh -c 'echo $$ >"$0"; exec "$@"' "$dir/gzpid_$i" \
      "$gzrun" --nnodes $hosts --node-rank "$i" --master-addr "$master" --master-port $port --nproc-per-node 2 \
      --rdzv-timeout 30 --heartbeat-timeout "$hb" --grace-period 1 --dump-wait 0.3 --verdict-wait 0.5 \
      -- "$worker" "$dir" 65536 "$hb" \
      >"$dir/host$i.log" 2>&1
    echo $? >"$dir/rc_$i"
    now_ns >"$dir/end_$i.tmp" && mv "$dir/end_$i.tmp" "$dir/end_$i"  # whole or absent
  ) 2>/dev/null &
done
for ((t = 0; t < 600; ++t)); do
  n=$(ls "$dir"/pid_* 2>/dev/null | grep -vc '\.tmp$')
  [ "$n" = "$world" ] && break
  sleep 0.05
done
[ "$n" = "$world" ] || fail "only $n of $world workers all-reduced once"
sleep 0.5  # all-reduces in flight everywhere

victim=1
[ "$scenario" = storehost ] && victim=0
victims="$(cat "$dir/gzpid_$victim") $(cat "$dir/pid_$((2 * victim))") $(cat "$dir/pid_$((2 * victim + 1))")"
t0=$(now_ns)
case $scenario in
  kill | storehost) kill -9 $victims ;;
  stop) kill -STOP $victims ;;
  link) "${C[@]}" link 1 down ;;
esac

# Survivors: every host but the victim; with the cable pulled, host 1 is cut off too and must stop.
watch=()
for ((i = 0; i < hosts; ++i)); do
  [ "$scenario" != link ] && [ $i = $victim ] && continue
  watch+=("$i")
done
for ((t = 0; t < 400; ++t)); do
  all=1
  for i in "${watch[@]}"; do [ -f "$dir/end_$i" ] || all=0; done
  [ $all = 1 ] && break
  sleep 0.05
done

report=""
for i in "${watch[@]}"; do
  [ -f "$dir/end_$i" ] || fail "host $i: gzrun still running $((($(now_ns) - t0) / 1000000)) ms after the fault"
  ms=$((($(cat "$dir/end_$i") - t0) / 1000000))
  [ "$(cat "$dir/rc_$i")" != 0 ] || fail "host $i: gzrun exited 0"
  [ "$ms" -le "$bound_ms" ] || fail "host $i: gzrun ended $ms ms after the fault (bound $bound_ms ms)"
  # A killed node resets its connections: the survivors' workers raise at once, and no gzrun may
  # then wait the heartbeat timeout (the store host waits only for nodes that still heartbeat).
  # The cut-off host learns it lost the store when the store has been silent for the heartbeat
  # timeout, not when a store request begun just before that times out too (it ended at 5.0 s).
  [ "$scenario" != link ] || [ $i != 1 ] || [ "$ms" -le $((hb * 1000 + 1500)) ] ||
    fail "host 1: gzrun ended $ms ms after its cable was pulled (bound $((hb * 1000 + 1500)) ms)"
  [ "$scenario" != kill ] || [ "$ms" -le $((hb * 1000 - 500)) ] ||
    fail "host $i: gzrun ended $ms ms after a SIGKILL that its workers saw at once (bound $((hb * 1000 - 500)) ms)"
  # The round's failure record, or (store host gone before it could be written) the local one.
  grep -Eq "job failure in round 0: |job failed \(no restarts allowed\): " "$dir/host$i.log" ||
    fail "host $i: gzrun names no failure"
  report+=" host$i: gzrun ${ms} ms"
  for r in $((2 * i)) $((2 * i + 1)); do
    p=$(cat "$dir/pid_$r")
    if kill -0 "$p" 2>/dev/null && ! grep -q '^[^)]*) Z' "/proc/$p/stat" 2>/dev/null; then
      fail "rank $r (pid $p) of host $i still runs"
    fi
    if [ -f "$dir/raised_$r" ]; then
      rms=$((($(cat "$dir/raised_$r") - t0) / 1000000))
      [ "$rms" -le "$bound_ms" ] || fail "rank $r raised $rms ms after the fault (bound $bound_ms ms)"
      report+=", rank $r raised ${rms} ms"
    else
      report+=", rank $r stopped"
    fi
  done
  report+=";"
done
cause=$(grep -h -m1 -Eo "(job failure in round 0|job failed \(no restarts allowed\)): .*" "$dir/host${watch[0]}.log" |
  cut -c1-160)
echo "PASS: $scenario mid-all-reduce, 3 hosts x 2 ranks, deadline ${hb} s, bound ${bound_ms} ms:$report" \
  "(host ${watch[0]}: $cause)"
