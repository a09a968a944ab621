#!/usr/bin/env bash
# What scripts/cluster.sh promises, checked: every host has its own hostname, /dev/shm and
# address; two `run`s on one host share /dev/shm; hosts talk over TCP; `link down` cuts a host
# off (a connection attempt times out) and `link up` restores it; `rate` shapes the link; `down`
# leaves no namespace and no process behind, also after the state directory was lost.
#   cluster_selftest.sh CLUSTER_SH GZ_TCP_PINGPONG
# Exit 77 (skip) where namespaces are unavailable.
set -uo pipefail
cluster=$1 pp=$2
"$cluster" check || exit $?
id=st$$
C=("$cluster" -c "$id")
trap '"${C[@]}" down' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

"${C[@]}" up 3 || exit 1
# Identity and isolation.
for i in 0 1 2; do
  h=$("${C[@]}" run "$i" hostname)
  [ "$h" = "h$i" ] || bad "host $i has hostname '$h', want h$i"
  a=$("${C[@]}" run "$i" sh -c "ip -4 -o addr show dev eth0 | awk '{print \$4}'")
  [ "$a" = "$("${C[@]}" ip "$i")/24" ] || bad "host $i has address '$a'"
done
[ "$(hostname)" != h0 ] || bad "the machine's own hostname changed"
"${C[@]}" run 0 sh -c "echo here >/dev/shm/gz-selftest-$id" || bad "cannot write host 0's /dev/shm"
[ "$("${C[@]}" run 0 cat "/dev/shm/gz-selftest-$id" 2>/dev/null)" = here ] ||
  bad "a second run on host 0 does not see the first one's /dev/shm"
"${C[@]}" run 1 test -e "/dev/shm/gz-selftest-$id" && bad "host 1 sees host 0's /dev/shm"
[ -e "/dev/shm/gz-selftest-$id" ] && bad "the machine sees host 0's /dev/shm"
"${C[@]}" run 1 getent hosts h2 | grep -q "$("${C[@]}" ip 2)" || bad "h2 does not resolve on host 1"
[ -z "$("${C[@]}" run 1 ip route show default)" ] || bad "host 1 has a default route out of the cluster"

# TCP between hosts 1 and 2 (not through host 0).
tcp() {  # client on host $1 to server on host $2; prints the stream MB/s
  "${C[@]}" run "$2" timeout 30 "$pp" server --once --port 29601 >/dev/null &
  local s=$!
  "${C[@]}" run "$1" timeout 30 "$pp" client "h$2" --port 29601 --sizes 4K --seconds 0.05 --stream-mib "$3" |
    sed -n 's/.*stream.*MBps=\([0-9.]*\).*/\1/p'
  wait $s
}
mbps=$(tcp 1 2 32)
[ -n "$mbps" ] || bad "no TCP between host 1 and host 2"
echo "host 1 -> host 2: $mbps MB/s unshaped"

# A pulled cable: connecting times out (packets lost, not refused); replugged, it works again.
"${C[@]}" link 2 down
out=$("${C[@]}" run 1 timeout 2 bash -c "exec 3<>/dev/tcp/$("${C[@]}" ip 2)/9" 2>&1)
rc=$?
[ $rc = 124 ] || bad "link 2 down: connecting to host 2 ended with $rc ($out), want a timeout (124)"
"${C[@]}" link 2 up
ok=0
for _ in $(seq 30); do
  out=$("${C[@]}" run 1 timeout 1 bash -c "exec 3<>/dev/tcp/$("${C[@]}" ip 2)/9" 2>&1)
  [[ $out == *refused* ]] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || bad "link 2 up: host 2 unreachable ($out)"

# Shaping: 80 Mbit/s = 10 MB/s; 8 MiB take about 0.8 s.
"${C[@]}" rate 1 80mbit && "${C[@]}" rate 2 80mbit || bad "rate failed"
mbps=$(tcp 1 2 8)
echo "host 1 -> host 2: $mbps MB/s at 80mbit"
awk -v m="${mbps:-0}" 'BEGIN { exit !(m > 5 && m < 12) }' || bad "shaped stream at $mbps MB/s, want about 10"
"${C[@]}" rate 1 off && "${C[@]}" rate 2 off || bad "rate off failed"

# down after the state was lost (a crash of the caller): found by name, nothing left.
holders=$(ip netns pids "gzc_${id}_h0")
rm -rf "/run/gz-cluster/$id"
"${C[@]}" down
left=$(ip netns list | grep -c "^gzc_${id}_")
[ "$left" = 0 ] || bad "$left namespaces left after down"
# (A killed holder may stay a zombie for a moment, until init reaps it: that is not running.)
running() { [ -e "/proc/$1" ] && ! grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null; }
for p in $holders; do running "$p" && bad "holder $p still runs after down"; done
"${C[@]}" down || bad "second down failed (must be idempotent)"

[ $fail = 0 ] && echo "PASS: cluster.sh hosts are isolated, connected, shaped and cleaned up"
exit $fail
