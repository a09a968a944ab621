#!/usr/bin/env bash
# Runs a test program in a network namespace of its own whose ephemeral port range is narrow
# (net.ipv4.ip_local_port_range is per namespace), so that Linux makes connections to different
# peers share local ports: what code that tells sockets apart by their local address alone gets
# wrong every time instead of now and then. Needs root and unshare; exits 77 (skip) otherwise.
#   narrow_ports.sh PROG [ARGS...]
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: narrow_ports.sh PROG [ARGS...]" >&2; exit 2; }
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (a network namespace)"
command -v unshare >/dev/null || skip "unshare (util-linux) not installed"
command -v ip >/dev/null || skip "iproute2 (ip) not installed"
[ -x "$1" ] || { echo "FAIL: $1 is not executable"; exit 1; }
unshare -n true 2>/dev/null || skip "unshare -n is not permitted here"
# 200 ports: enough for every listening socket of 7 ranks x 2 meshes, few enough that outgoing
# connections share them.
exec unshare -n sh -c 'ip link set lo up && sysctl -q -w net.ipv4.ip_local_port_range="40000 40199" && exec "$@"' \
  narrow_ports "$@"
