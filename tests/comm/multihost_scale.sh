#!/usr/bin/env bash
# Toward many nodes: 4, 8 and 16 simulated hosts x 2 ranks (backend auto: shm inside a host, Gloo
# rails across hosts), every collective checked against the reference (correctness only: 32
# ranks share this machine's cores). Also the store round trips each rank makes for rendezvous
# and connecting: they must not grow with the number of hosts (a rank that read one key per peer
# would make 2 more per extra host).
#   multihost_scale.sh CLUSTER_SH GZRUN WORKER
set -uo pipefail
[ $# = 3 ] || { echo "usage: multihost_scale.sh CLUSTER_SH GZRUN WORKER" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
"$1" check || exit $?
declare -A trips
for hosts in 4 8 16; do
  # Defaults: Gloo's synchronous mesh on every rail (its addresses gathered like the first
  # mesh's), the flat communicator connected lazily (no store traffic at creation).
  out=$(GZ_TEST_FULL=0 MH_TIMEOUT_S=150 "$here/multihost.sh" "$1" "$2" "$3" "$hosts" 2 auto 2>&1)
  status=$?
  echo "$out" | grep -E '^(PASS|FAIL)|store round trips'
  if [ $status != 0 ]; then
    echo "$out" | tail -n 60
    echo "FAIL: $hosts hosts x 2 ranks"
    exit 1
  fi
  trips[$hosts]=$(echo "$out" | sed -n 's/^store round trips per rank: max \([0-9]*\)$/\1/p')
done
echo "store round trips per rank (max over ranks): 4 hosts ${trips[4]}, 8 hosts ${trips[8]}, 16 hosts ${trips[16]}"
# Constant per rank: allow a couple of retries, never one per host.
if [ "${trips[16]}" -gt $((trips[4] + 3)) ]; then
  echo "FAIL: store round trips per rank grow with the number of hosts"
  exit 1
fi
echo "PASS: 16 hosts x 2 ranks correct; store round trips per rank do not grow with the hosts"
