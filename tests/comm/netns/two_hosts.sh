#!/usr/bin/env bash
# Two simulated hosts: network namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2), two
# ranks in each with different GZ_NODE_ID (the hostname is the same in both) and the auto
# backend, so the run uses hierarchical shm + gloo over the veth. Needs root; exits 77 (skip)
# otherwise or when `ip netns` does not work here.
#   two_hosts.sh PROG [GZRUN]     PROG: test_hier_two_hosts; GZRUN: the launcher (optional)
# GZ_NETNS_DELAY=5ms adds a netem delay on both veth ends.
set -uo pipefail
prog=${1:?usage: two_hosts.sh PROG [GZRUN]}
gzrun=${2:-}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
[ -x "$prog" ] || { echo "FAIL: $prog is not executable"; exit 1; }

ns_a=gzA$$
ns_b=gzB$$
veth_a=gzva$$
veth_b=gzvb$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  ip link del "$veth_a" 2>/dev/null
  true
}
trap cleanup EXIT INT TERM

# Setting up the hosts is the environment's part: where it does not work (no CAP_SYS_ADMIN, or a
# chroot whose / is not a mount point, so `ip netns` cannot bind its namespaces) the test skips.
# Only what runs after the namespaces are proven to talk can fail it.
ip netns add "$ns_a" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN or no netns support)"
ip netns add "$ns_b" 2>/dev/null || skip "ip netns add failed"
ip netns exec "$ns_a" true 2>/dev/null || skip "ip netns exec does not work here (inside a chroot?)"
ip link add "$veth_a" type veth peer name "$veth_b" || skip "cannot create a veth pair"
{
  ip link set "$veth_a" netns "$ns_a" &&
    ip link set "$veth_b" netns "$ns_b" &&
    ip -n "$ns_a" addr add 10.77.0.1/24 dev "$veth_a" &&
    ip -n "$ns_b" addr add 10.77.0.2/24 dev "$veth_b" &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
    ip -n "$ns_a" link set "$veth_a" up &&
    ip -n "$ns_b" link set "$veth_b" up
} || skip "could not configure the veth pair inside the namespaces"
if [ -n "${GZ_NETNS_DELAY:-}" ]; then
  ip netns exec "$ns_a" tc qdisc add dev "$veth_a" root netem delay "$GZ_NETNS_DELAY" || echo "note: tc netem unavailable"
  ip netns exec "$ns_b" tc qdisc add dev "$veth_b" root netem delay "$GZ_NETNS_DELAY" || true
fi
ip -n "$ns_b" route get 10.77.0.1 >/dev/null || skip "no route between the namespaces"

port=29517
# Two hosts: the store is beyond loopback, so every rank needs the job's token.
export GZ_RDZV_TOKEN=${GZ_RDZV_TOKEN:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}
common=(env GZ_EXPECT_BACKEND="hier(shm+gloo)" GZ_LOG_LEVEL="${GZ_LOG_LEVEL:-warn}")
if [ -n "$gzrun" ] && [ -x "$gzrun" ]; then
  echo "launching through $gzrun"
  for node in 0 1; do
    ns=$ns_a; [ $node = 1 ] && ns=$ns_b
    ip netns exec "$ns" "${common[@]}" GZ_NODE_ID="host$node" timeout 120 "$gzrun" --nnodes 2 --node-rank $node \
      --master-addr 10.77.0.1 --master-port $port --nproc-per-node 2 "$prog" &
    pids+=($!)
  done
else
  echo "launching 4 processes with torchrun-style variables (no gzrun given)"
  for rank in 0 1 2 3; do
    node=$((rank / 2)); ns=$ns_a; [ $node = 1 ] && ns=$ns_b
    ip netns exec "$ns" "${common[@]}" GZ_NODE_ID="host$node" RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$((rank % 2)) \
      LOCAL_WORLD_SIZE=2 GROUP_RANK=$node NODE_RANK=$node MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
      timeout 120 "$prog" &
    pids+=($!)
  done
fi
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
pids=()
if [ $status = 0 ]; then echo "PASS: 2 hosts x 2 ranks, hierarchical shm + gloo over veth"; else echo "FAIL"; fi
exit $status
