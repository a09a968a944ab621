#!/usr/bin/env bash
# gzrun --preflight on one machine, no root needed: the check alone on one node (compute, shm,
# memory), then two nodes on loopback (the link probe over Gloo, compute in turns since both
# "nodes" share this machine's boot id) in front of a real job that must then run.
#   test_preflight_local.sh GZRUN
set -uo pipefail
gzrun=$1
[ -x "$gzrun" ] || { echo "FAIL: $gzrun is not executable"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "---- $f"; cat "$f"; done; exit 1; }

# 1. One node, alone: the table, exit 0 (nothing to compare with, nothing flagged).
"$gzrun" --preflight --nproc-per-node 2 >"$dir/one.log" 2>&1
rc=$?
[ $rc = 0 ] || fail "one node: exit $rc"
grep -q 'preflight: 1 node(s); links: 0 pair(s)' "$dir/one.log" || fail "one node: no header"
grep -q 'preflight: all 1 node(s) ok' "$dir/one.log" || fail "one node: no verdict"
grep -Eq '^ +0  .* [0-9]+\.[0-9]+ [0-9]+\.[0-9]+ ' "$dir/one.log" || fail "one node: no GFLOP/s for 2 ranks"

# 2. Two nodes on loopback before a job: probe, table on node 0, one line on node 1, job runs.
port=$((20000 + RANDOM % 20000))
export GZ_RDZV_TOKEN=preflight-local-$$
start=$(date +%s%N)
for n in 0 1; do
  "$gzrun" --nnodes 2 --node-rank $n --master-addr 127.0.0.1 --master-port $port --preflight \
    --rdzv-timeout 30 -- /bin/sh -c "touch $dir/ran_\$RANK" >"$dir/node$n.log" 2>&1 &
  pids[$n]=$!
done
for n in 0 1; do
  wait "${pids[$n]}"
  rc=$?
  [ $rc = 0 ] || fail "node $n: exit $rc"
done
ms=$((($(date +%s%N) - start) / 1000000))
grep -q 'preflight: 2 node(s); links: 1 pair(s), 2 x 1024 KiB each way' "$dir/node0.log" || fail "two nodes: no header"
grep -q 'in turns (the nodes share one machine)' "$dir/node0.log" || fail "two nodes: compute not in turns"
grep -Eq '^ +1  .*[0-9.]+ [MG]B/s' "$dir/node0.log" || fail "two nodes: no link rate for node 1"
grep -q 'preflight: all 2 node(s) ok' "$dir/node1.log" || fail "node 1: no verdict line"
[ -f "$dir/ran_0" ] && [ -f "$dir/ran_1" ] || fail "the job did not run after a clean check"
echo "PASS: one node alone, then two loopback nodes checked in front of a job ($ms ms in all)"
grep -v '^\[' "$dir/node0.log"
