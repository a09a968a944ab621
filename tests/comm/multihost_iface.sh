#!/usr/bin/env bash
# GZ_SOCKET_IFNAME across simulated hosts (scripts/cluster.sh), 2 hosts x 1 rank, backend auto,
# through gzrun and the multihost worker:
#   eth0 on both hosts              every op x dtype passes
#   nosuch0 on host 0               host 0 fails at once: no such interface (the interfaces named)
#   lo on host 1                    host 1 fails at once: loopback, which host 0 cannot reach
#   10.1.0.1 on host 0              an extra address of host 0 (on its lo), which host 1 has no
#                                   route to: host 1's connect fails naming it and the variable
# A failing rank makes gzrun stop every node (job-wide failure), so no case waits for a timeout.
#   multihost_iface.sh CLUSTER_SH GZRUN WORKER
set -uo pipefail
[ $# = 3 ] || { echo "usage: multihost_iface.sh CLUSTER_SH GZRUN WORKER" >&2; exit 2; }
cluster=$1 gzrun=$2 worker=$3
for f in "$cluster" "$gzrun" "$worker"; do [ -x "$f" ] || { echo "FAIL: $f is not executable"; exit 1; }; done
"$cluster" check || exit $?
id=mi$$
C=("$cluster" -c "$id")
logs=$(mktemp -d)
trap '"${C[@]}" down >/dev/null 2>&1; [ -n "${KEEP_LOGS:-}" ] && cp -r "$logs" "$KEEP_LOGS"; rm -rf "$logs"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${C[@]}" up 2 >/dev/null || exit 1
master=$("${C[@]}" ip 0)
# Lower than the hosts' 10.77.0.x, so host 0 is the listening side of every Gloo pair with host 1.
"${C[@]}" run 0 ip addr add 10.1.0.1/32 dev lo || { echo "FAIL: cannot add an address on host 0"; exit 1; }
status=0
# Several hosts: the store listens beyond loopback, so every node needs the job's token.
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

# run_case NAME IFNAME0 IFNAME1: both hosts' gzrun; logs in $logs/NAME.<host>; statuses in rc0 rc1.
run_case() {
  local name=$1 i pids=() ifs=("$2" "$3")
  for i in 0 1; do
    "${C[@]}" run $i env -u GZ_NODE_ID GTEST_COLOR=no GZ_TEST_FULL=0 GZ_EXPECT_HOSTS=2 GZ_LOG_LEVEL=warn \
      GZ_TEST_BACKEND=auto GZ_SOCKET_IFNAME="${ifs[$i]}" timeout 60 "$gzrun" --nnodes 2 --node-rank $i \
      --master-addr "$master" --master-port 29500 --nproc-per-node 1 --rdzv-timeout 30 -- "$worker" \
      >"$logs/$name.$i" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}"; rc0=$?
  wait "${pids[1]}"; rc1=$?
}
# expect NAME HOST PATTERN: PATTERN (grep -E) in host HOST's log of case NAME.
expect() {
  if ! grep -q -E "$3" "$logs/$1.$2"; then
    echo "FAIL: $1: host $2's log lacks /$3/; it ends with:"; tail -n 25 "$logs/$1.$2"; status=1
  fi
}

start=$(date +%s)
run_case good eth0 eth0
if [ $rc0 != 0 ] || [ $rc1 != 0 ]; then
  echo "FAIL: GZ_SOCKET_IFNAME=eth0 on both hosts: exit $rc0 / $rc1"; tail -n 25 "$logs/good.0" "$logs/good.1"; status=1
fi
run_case unknown nosuch0 eth0
[ $rc0 != 0 ] || { echo "FAIL: an unknown interface was accepted"; status=1; }
expect unknown 0 "GZ_SOCKET_IFNAME=nosuch0: no network interface of that name here \(interfaces: .*eth0"
run_case loopback eth0 lo
[ $rc1 != 0 ] || { echo "FAIL: a loopback interface was accepted for a job across hosts"; status=1; }
expect loopback 1 "GZ_SOCKET_IFNAME=lo gives 127.0.0.1, a loopback address"
run_case unreachable 10.1.0.1 eth0
[ $rc1 != 0 ] || { echo "FAIL: a rank reached an address it has no route to"; status=1; }
expect unreachable 1 "10\.1\.0\.1.*GZ_SOCKET_IFNAME"
secs=$(($(date +%s) - start))
[ $status = 0 ] && echo "PASS: GZ_SOCKET_IFNAME: eth0 works; unknown, loopback and unreachable fail clearly (${secs} s)"
exit $status
