#!/usr/bin/env bash
# gzrun --preflight on the simulated cluster (scripts/cluster.sh): HOSTS hosts (default 16) x 2
# ranks, every link shaped to 1 Gbit/s; one host's link shaped to 100 Mbit/s and another host's
# gzrun (and so its compute probe) under a cgroup v1 CPU quota of 2% of a core (on this loaded
# 2-core machine an unthrottled thread gets 10-20% of a core, so 5% was only a factor 2-4).
#
#   multihost_preflight.sh CLUSTER_SH GZRUN
#
# 1. --preflight=strict in front of a job on every host: node 0's table must flag the shaped host
#    (slow link) and the throttled one (slow compute), and no other; every gzrun must exit 4 without
#    starting a worker; the check must take under 30 s (node 0's gzrun, start to exit).
# 2. --preflight (warn) on 4 healthy hosts (the quota and the shaping gone): all ok, the job runs.
# Env: HOSTS, KEEP_LOGS=DIR. Exit 77 (skip) without root/namespaces/cgroup v1 cpu.
set -uo pipefail
[ $# = 2 ] || { echo "usage: multihost_preflight.sh CLUSTER_SH GZRUN" >&2; exit 2; }
cluster=$1 gzrun=$2
[ -x "$gzrun" ] || { echo "FAIL: $gzrun is not executable"; exit 1; }
"$cluster" check || exit $?
cg=/sys/fs/cgroup/cpu
[ -w "$cg" ] || { echo "SKIP: no writable cgroup v1 cpu controller at $cg"; exit 77; }
hosts=${HOSTS:-16}
slow_link=$((1 + RANDOM % (hosts - 1)))
slow_cpu=$((1 + RANDOM % (hosts - 1)))
while [ "$slow_cpu" = "$slow_link" ]; do slow_cpu=$((1 + RANDOM % (hosts - 1))); done

id=pf$$
C=("$cluster" -c "$id")
dir=$(mktemp -d)
cgroup=$cg/gz_preflight_$$
cleanup() {
  for f in "$dir"/gzpid_?_*[0-9]; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    for c in $(pgrep -P "$p"); do kill -9 "$c" 2>/dev/null; done
    kill -9 "$p" 2>/dev/null
  done
  "${C[@]}" down >/dev/null
  sleep 0.2
  [ -d "$cgroup" ] && rmdir "$cgroup" 2>/dev/null
  [ -n "${KEEP_LOGS:-}" ] && mkdir -p "$KEEP_LOGS" && cp "$dir"/*.log "$KEEP_LOGS"/ 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
  echo "---- node 0"
  cat "$dir/a_host0.log" 2>/dev/null
  echo "FAIL: $* (slow link: host $slow_link, throttled: host $slow_cpu)"
  exit 1
}
wait_rc() {  # PREFIX N: wait (60 s) for rc files PREFIX_0 .. PREFIX_{N-1}
  for ((t = 0; t < 1200; ++t)); do
    local n=0
    for ((i = 0; i < $2; ++i)); do [ -f "$dir/$1_$i" ] && n=$((n + 1)); done
    [ $n = "$2" ] && return 0
    sleep 0.05
  done
  fail "gzruns of phase $1 did not all end within 60 s"
}
launch() {  # PHASE NODES MODE: gzrun on hosts 0..NODES-1
  local phase=$1 n=$2 mode=$3 port=$((20000 + RANDOM % 20000)) master
  master=$("${C[@]}" ip 0)
  for ((i = 0; i < n; ++i)); do
    (
      # The shell waits for "go": the throttled host's shell is moved into the cgroup first (from
      # here: the host's mount namespace does not see cgroups made after it), gzrun inherits it.
      "${C[@]}" run "$i" env -u GZ_NODE_ID GZ_RDZV_TOKEN="preflight-test-$$" \
        sh -c 'echo $$ >"$0"; while [ ! -f "$0.go" ]; do sleep 0.01; done; s=$(date +%s%N); "$@"; rc=$?; echo $((($(date +%s%N) - s) / 1000000)) >"$0.ms"; exit $rc' \
        "$dir/gzpid_${phase}_$i" \
        "$gzrun" --nnodes "$n" --node-rank "$i" --master-addr "$master" --master-port "$port" --nproc-per-node 2 \
        --rdzv-timeout 60 "$mode" -- /bin/sh -c "touch $dir/ran_${phase}_\$RANK" >"$dir/${phase}_host$i.log" 2>&1
      echo $? >"$dir/${phase}_$i"
    ) 2>/dev/null &
  done
  for ((i = 0; i < n; ++i)); do
    for ((t = 0; t < 400; ++t)); do [ -s "$dir/gzpid_${phase}_$i" ] && break; sleep 0.05; done
    if [ "$phase" = a ] && [ "$i" = "$slow_cpu" ]; then
      cat "$dir/gzpid_${phase}_$i" >"$cgroup/cgroup.procs" || fail "cannot move host $i's shell into $cgroup"
    fi
    touch "$dir/gzpid_${phase}_$i.go"
  done
}

t0=$(date +%s%N)
"${C[@]}" up "$hosts" --rate 1gbit >/dev/null || exit $?
up_ms=$((($(date +%s%N) - t0) / 1000000))
"${C[@]}" rate "$slow_link" 100mbit || fail "cannot shape host $slow_link"
mkdir -p "$cgroup" && echo 100000 >"$cgroup/cpu.cfs_period_us" && echo 2000 >"$cgroup/cpu.cfs_quota_us" ||
  fail "cannot set up $cgroup"

# 1. strict, 16 hosts, two faults.
launch a "$hosts" --preflight=strict
wait_rc a "$hosts"
for ((i = 0; i < hosts; ++i)); do
  [ "$(cat "$dir/a_$i")" = 4 ] || fail "phase 1: host $i's gzrun exited $(cat "$dir/a_$i"), expected 4"
done
ls "$dir"/ran_a_* >/dev/null 2>&1 && fail "phase 1: a worker started although strict refused the job"
ms=$(cat "$dir/gzpid_a_0.ms")
[ "$ms" -lt 30000 ] || fail "phase 1: the check took $ms ms (bound 30000)"
log=$dir/a_host0.log
table_line() { grep -E "^ +$1  h$1 " "$log"; }
table_line "$slow_link" | grep -q 'slow link:' || fail "host $slow_link's link is not flagged"
table_line "$slow_cpu" | grep -q 'slow compute:' || fail "host $slow_cpu's compute is not flagged"
# Exactly those two (the throttled host may also show slow links: its CPU moves its packets too).
grep -q "preflight: flagged 2 of $hosts node(s)" "$log" || fail "not exactly 2 nodes flagged"
grep -q 'not starting the job' "$log" || fail "no strict refusal message"
grep -q 'preflight: flagged 2' "$dir/a_host1.log" || fail "node 1 does not print the verdict"

# 2. warn mode, 4 healthy hosts: the job starts.
"${C[@]}" rate "$slow_link" 1gbit >/dev/null
launch b 4 --preflight
wait_rc b 4
for ((i = 0; i < 4; ++i)); do [ "$(cat "$dir/b_$i")" = 0 ] || fail "phase 2: host $i's gzrun exited $(cat "$dir/b_$i")"; done
grep -q 'preflight: all 4 node(s) ok' "$dir/b_host0.log" || fail "phase 2: the healthy hosts are not all ok"
[ "$(ls "$dir"/ran_b_* | wc -l)" = 8 ] || fail "phase 2: the job did not run on all 8 ranks"
echo "PASS: $hosts hosts (cluster up in $up_ms ms): the check flagged host $slow_link (slow link) and host" \
  "$slow_cpu (slow compute) in $ms ms and strict refused the job; 4 healthy hosts passed and the job ran"
grep -v '^\[' "$log"
