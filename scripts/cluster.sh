#!/usr/bin/env bash
# A simulated cluster on one machine: N "hosts", each a network namespace with its own hostname
# (UTS namespace), its own /dev/shm and /etc/hosts (mount namespace), wired to a private bridge
# through a veth pair. A host really cannot see another host's shared memory or share its node
# identity, and all traffic stays inside namespaces this script created: the bridge lives in a
# "switch" namespace of its own, nothing is added to the machine's own network namespace, and the
# hosts have no route out.
#
#   cluster.sh [-c ID] up N [--rate R] [--shm-size S]
#                                      start hosts 0..N-1 (h0, h1, ... at 10.77.0.1, .2, ...);
#                                      --rate 1gbit: tbf limits every host's NIC to R in each
#                                      direction (host egress + switch port egress); --shm-size:
#                                      size of each host's /dev/shm tmpfs (default 1g)
#   cluster.sh [-c ID] run I CMD...    run CMD on host I (cwd and environment kept; exit status
#                                      passed through); GZ_CLUSTER_HOST=I is set
#   cluster.sh [-c ID] ip I            address of host I
#   cluster.sh [-c ID] size            number of hosts
#   cluster.sh [-c ID] link I down|up  unplug / replug host I's cable (the switch port: packets
#                                      are lost silently, connections time out)
#   cluster.sh [-c ID] rate I R|off    change host I's shaping
#   cluster.sh [-c ID] with N [up options] -- CMD...
#                                      up, run CMD (on the machine, with GZ_CLUSTER=ID exported)
#                                      and down, whatever happens
#   cluster.sh [-c ID] rsh HOST CMD... what ssh does, for mpirun's plm_rsh_agent: run the shell
#                                      command CMD on HOST (h<i> or its address), e.g.
#                                      mpirun --mca plm_rsh_agent "cluster.sh -c ID rsh" --host h0,h1
#   cluster.sh [-c ID] down            tear the cluster down (idempotent; finds leftovers by name)
#   cluster.sh down --all              tear down every cluster of this script (crash leftovers)
#   cluster.sh check                   prerequisites only
#   cluster.sh list                    clusters that are up
#
# ID (default: $GZ_CLUSTER, else "0") names the cluster: [A-Za-z0-9]{1,20}. Clusters with
# different ids are independent (own switch, same subnet 10.77.0.0/24), so parallel tests only
# need different ids, e.g. -c t$$.
#
# Every host has a holder process (`sleep infinity` inside unshare --uts --mount, in the host's
# network namespace); `run` enters its namespaces with nsenter, so two `run`s on one host share
# /dev/shm, hostname and network, as processes of one machine do.
#
# Exit status: 0 ok; 1 failure; 2 usage; 77 the prerequisites are missing (not root, no ip /
# unshare / nsenter, namespaces not permitted here): the message starts with "SKIP:".
set -uo pipefail

readonly SUBNET_PREFIX=10.77.0
readonly NS_PREFIX=gzc_
state_root=${GZ_CLUSTER_STATE:-/run/gz-cluster}

die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
skip() { echo "SKIP: cluster.sh: $*" >&2; exit 77; }

id=${GZ_CLUSTER:-0}
if [ "${1:-}" = -c ]; then
  [ $# -ge 2 ] || usage
  id=$2
  shift 2
fi
[[ $id =~ ^[A-Za-z0-9]{1,20}$ ]] || die "cluster id '$id' must be 1-20 letters or digits"
ns_sw=${NS_PREFIX}${id}_sw
ns_host() { echo "${NS_PREFIX}${id}_h$1"; }
state=$state_root/$id

# Prerequisites that can be checked without changing anything.
check_tools() {
  [ "$(id -u)" = 0 ] || skip "needs root (network, UTS and mount namespaces)"
  local t
  for t in ip unshare nsenter mount sleep; do
    command -v "$t" >/dev/null 2>&1 || skip "'$t' not found (install iproute2 / util-linux)"
  done
  unshare --uts --mount --propagation private true 2>/dev/null ||
    skip "unshare --uts --mount is not permitted here (no CAP_SYS_ADMIN?)"
}

host_count() { [ -f "$state/n" ] && cat "$state/n" || echo 0; }

host_index() {  # validates I against the running cluster
  [[ ${1:-} =~ ^[0-9]+$ ]] || die "host index '${1:-}' is not a number"
  local n
  n=$(host_count)
  [ "$n" -gt 0 ] || die "cluster '$id' is not up (cluster.sh -c $id up N)"
  [ "$1" -lt "$n" ] || die "cluster '$id' has hosts 0..$((n - 1)), not $1"
}

holder_pid() {
  local pid
  pid=$(cat "$state/holder.$1" 2>/dev/null) || die "host $1 of cluster '$id' has no holder process"
  kill -0 "$pid" 2>/dev/null || die "host $1 of cluster '$id': holder $pid is gone (cluster.sh -c $id down; up again)"
  echo "$pid"
}

# "1gbit" / "100mbit" / "500kbit" / "10mbps" -> bytes per second (tc's units: bit = bits, bps = bytes).
rate_bytes() {
  local r=${1,,} num unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit|bps)$ ]] || die "rate '$1': want e.g. 1gbit, 100mbit, 500kbit"
  num=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[3]}
  awk -v n="$num" -v u="$unit" -v b="${BASH_REMATCH[4]}" 'BEGIN {
    m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : (u == "t") ? 1e12 : 1;
    v = n * m; if (b == "bit") v /= 8; printf "%d\n", v }'
}

# Token bucket on one device inside one namespace. The bucket holds 2 ms of traffic (at least
# 16 KiB, so a full-size frame always fits); the queue holds 20 ms before dropping.
shape() {  # ns dev rate|off
  if [ "$3" = off ]; then
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null || true
    return 0
  fi
  local bps burst
  bps=$(rate_bytes "$3") || exit 1
  burst=$((bps / 500))
  [ "$burst" -lt 16384 ] && burst=16384
  ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 20ms
}

set_rate() {  # host rate|off: both directions of host I's link
  shape "$(ns_host "$1")" eth0 "$2" && shape "$ns_sw" "h$1" "$2"
}

# Everything of cluster $id, found by name, so it also cleans up after a crash that lost $state.
do_down() {
  local ns pids
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NS_PREFIX}${id}_(sw|h[0-9]+)$"); do
    # Every process in the namespace: holders, and whatever was started on the host and outlived
    # its caller (they all live in namespaces this script made).
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    for _ in $(seq 50); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.1
    done
    ip netns del "$ns" 2>/dev/null
  done
  # Holders whose namespace name is gone (ip netns del by hand) but that still run.
  for pidf in "$state"/holder.*; do
    [ -f "$pidf" ] || continue
    pids=$(cat "$pidf")
    # Only a process that is still our holder: different UTS namespace from ours and a sleep.
    if [ -n "$pids" ] && [ "$(cat /proc/"$pids"/comm 2>/dev/null)" = sleep ] &&
       [ "$(readlink /proc/"$pids"/ns/uts)" != "$(readlink /proc/self/ns/uts)" ]; then
      kill -9 "$pids" 2>/dev/null
    fi
  done
  rm -rf "$state"
  return 0
}

do_up() {
  local n=${1:-} rate="" shm_size=1g
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "up: want a host count 1..200, got '$n'"
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --rate=*) rate=${1#*=}; shift ;;
      --shm-size) shm_size=${2:?--shm-size needs a value}; shift 2 ;;
      --shm-size=*) shm_size=${1#*=}; shift ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  check_tools
  if [ -n "$rate" ]; then
    rate_bytes "$rate" >/dev/null || exit 1
    command -v tc >/dev/null 2>&1 || skip "--rate needs tc (iproute2)"
  fi
  if [ -d "$state" ] || ip netns list 2>/dev/null | grep -q -E "^${NS_PREFIX}${id}_"; then
    die "cluster '$id' is already up (or left over): cluster.sh -c $id down"
  fi
  # From here on, a failure takes down what was built.
  trap 'do_down' EXIT
  mkdir -p "$state" || die "cannot create $state"
  # Whether namespaces work at all here (a chroot whose / is not a mount point breaks ip netns).
  ip netns add "$ns_sw" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN, or no network namespaces)"
  ip netns exec "$ns_sw" true 2>/dev/null || skip "ip netns exec does not work here (inside a chroot?)"
  ip -n "$ns_sw" link set lo up &&
    ip -n "$ns_sw" link add br0 type bridge 2>/dev/null || skip "cannot create a bridge in a namespace (no bridge module?)"
  ip -n "$ns_sw" link set br0 up || die "cannot bring the bridge up"

  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < n; ++i)); do echo "$SUBNET_PREFIX.$((i + 1)) h$i"; done
  } >"$state/hosts"

  local i ns
  for ((i = 0; i < n; ++i)); do
    ns=$(ns_host "$i")
    ip netns add "$ns" || die "ip netns add $ns failed"
    ip -n "$ns_sw" link add "h$i" type veth peer name eth0 netns "$ns" 2>/dev/null ||
      skip "cannot create veth pairs here"
    ip -n "$ns_sw" link set "h$i" master br0 up &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" addr add "$SUBNET_PREFIX.$((i + 1))/24" dev eth0 &&
      ip -n "$ns" link set eth0 up || die "cannot configure host $i's interface"
    if [ -n "$rate" ]; then
      set_rate "$i" "$rate" || skip "tc tbf is not available (sch_tbf)"
    fi
    # The holder: new UTS and mount namespaces inside the host's network namespace. It ignores
    # SIGINT/SIGHUP (a ^C meant for a test must not take the host down under it); down kills it.
    ip netns exec "$ns" unshare --uts --mount --propagation private sh -c '
      trap "" INT HUP
      hostname "$1" &&
        mount -t tmpfs -o size="$2",mode=1777 gzshm /dev/shm &&
        { [ ! -e /etc/hosts ] || mount --bind "$3" /etc/hosts; } &&
        : >"$4" && exec sleep infinity' sh "h$i" "$shm_size" "$state/hosts" "$state/ready.$i" \
      </dev/null >/dev/null 2>"$state/holder.$i.err" &
    echo $! >"$state/holder.$i"
  done
  echo "$n" >"$state/n"
  echo "$rate" >"$state/rate"

  local _
  for ((i = 0; i < n; ++i)); do
    for _ in $(seq 100); do
      [ -f "$state/ready.$i" ] && break
      kill -0 "$(cat "$state/holder.$i")" 2>/dev/null || break
      sleep 0.05
    done
    [ -f "$state/ready.$i" ] || die "host $i did not start: $(cat "$state/holder.$i.err" 2>/dev/null)"
  done
  # Every host reaches host 0 through the bridge (a refused TCP connection proves it) before
  # anyone uses the cluster.
  local out
  for ((i = 1; i < n; ++i)); do
    for _ in $(seq 50); do
      out=$(nsenter -t "$(cat "$state/holder.$i")" -n timeout 1 bash -c "exec 3<>/dev/tcp/$SUBNET_PREFIX.1/9" 2>&1)
      [[ $? = 0 || $out == *refused* ]] && break
      sleep 0.1
    done
    [[ $out == *refused* || -z $out ]] || die "host $i cannot reach host 0: $out"
  done
  trap - EXIT
  echo "cluster '$id': $n host(s) up ($SUBNET_PREFIX.1..$SUBNET_PREFIX.$n${rate:+, $rate per link})"
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
case $cmd in
  check)
    check_tools
    echo "cluster.sh: prerequisites present (root, ip, unshare, nsenter)"
    ;;
  up) do_up "$@" ;;
  down)
    if [ "${1:-}" = --all ]; then
      for c in $(ip netns list 2>/dev/null | awk '{print $1}' | sed -n -E "s/^${NS_PREFIX}([A-Za-z0-9]+)_(sw|h[0-9]+)$/\1/p" | sort -u) \
               $(ls "$state_root" 2>/dev/null); do
        "$0" -c "$c" down
      done
      exit 0
    fi
    command -v ip >/dev/null 2>&1 || { rm -rf "$state"; exit 0; }
    do_down
    ;;
  run)
    [ $# -ge 2 ] || usage
    host_index "$1"
    pid=$(holder_pid "$1")
    export GZ_CLUSTER_HOST=$1
    shift
    # nsenter into a mount namespace lands in its root directory: go back to the caller's cwd
    # (the same path exists there, only /dev/shm and /etc/hosts differ).
    exec nsenter -t "$pid" -n -u -m -- sh -c 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"' sh "$PWD" "$@"
    ;;
  ip)
    host_index "${1:-}"
    echo "$SUBNET_PREFIX.$(($1 + 1))"
    ;;
  size) host_count ;;
  link)
    host_index "${1:-}"
    case ${2:-} in
      # The switch's port, as a pulled cable: the host keeps its address and route (NO-CARRIER),
      # so its packets are lost and peers time out instead of failing at once.
      up | down) ip -n "$ns_sw" link set "h$1" "$2" ;;
      *) die "link I up|down" ;;
    esac
    ;;
  rate)
    host_index "${1:-}"
    [ -n "${2:-}" ] || die "rate I R|off"
    set_rate "$1" "$2"
    ;;
  with)
    # with N [up options] -- CMD...
    up_args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do up_args+=("$1"); shift; done
    [ "${1:-}" = -- ] && [ $# -ge 2 ] || die "with N [--rate R] -- CMD..."
    shift
    "$0" -c "$id" up "${up_args[@]}" || exit $?
    trap '"$0" -c "$id" down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    GZ_CLUSTER=$id "$@"
    exit $?
    ;;
  rsh)
    while [ "${1:-}" != "${1#-}" ]; do shift; done  # ssh-style options (-x, ...) mean nothing here
    [ $# -ge 2 ] || die "rsh HOST CMD..."
    case $1 in
      h[0-9]*) i=${1#h} ;;
      "$SUBNET_PREFIX".[0-9]*) i=$((${1##*.} - 1)) ;;
      *) die "rsh: '$1' is not a host of the cluster (h<i> or $SUBNET_PREFIX.<i+1>)" ;;
    esac
    shift
    # Like ssh: the arguments joined by spaces are one shell command line.
    exec "$0" -c "$id" run "$i" sh -c "$*"
    ;;
  list)
    ip netns list 2>/dev/null | awk '{print $1}' | sed -n -E "s/^${NS_PREFIX}([A-Za-z0-9]+)_sw$/\1/p"
    ;;
  -h | --help | help) usage ;;
  *) echo "cluster.sh: unknown command '$cmd'" >&2; usage ;;
esac
