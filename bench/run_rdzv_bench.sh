#!/usr/bin/env bash
# Rendezvous time, gzrun's TcpStore against an etcd cluster (--rdzv-backend etcd), side by side in
# one run: tests/comm/multihost.sh launches HOSTS simulated hosts x RANKS ranks (backend auto:
# shm inside a host, Gloo across) once per store and round, the stores interleaved (tcp, etcd,
# etcd-tls, then the next round starting with the next store), and reports per run
#   rdzv     ms from launching every host's gzrun until the last rank was through gz::rendezvous
#            (the gzruns' meeting, worker start, the workers' meeting in the store)
#   connect  ms until the last rank had its communicator (addresses exchanged through the store)
#   trips    the most store requests one rank made for both
# etcd: 3 members on hosts 0-2, plain http (--rdzv-insecure); etcd-tls: https with the members'
# certificates checked and etcd's authentication on (user gz, the rendezvous token as password).
#
#   bench/run_rdzv_bench.sh [BUILD_DIR]
#   env: HOSTS (16), RANKS (2), ROUNDS (3), STORES ("tcp etcd etcd-tls"), CSV (append rows
#        store,round,rdzv_ms,connect_ms,trips)
set -euo pipefail
. "$(dirname "$0")/autogroup.sh"
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
hosts=${HOSTS:-16} ranks=${RANKS:-2} rounds=${ROUNDS:-3}
read -r -a stores <<<"${STORES:-tcp etcd etcd-tls}"
for f in tools/gzrun/gzrun tests/comm/multihost_worker; do
  [ -x "$build/$f" ] || { echo "run_rdzv_bench: $build/$f is missing (build with -DGZ_BUILD_TESTS=ON)" >&2; exit 1; }
done
echo "# rendezvous, $hosts hosts x $ranks ranks; $(date -u +%FT%TZ) on $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'); etcd $(etcd --version 2>/dev/null | head -n 1 | cut -d' ' -f3)"
declare -A rdzv connect
printf '%-9s %5s %8s %10s %6s\n' store round rdzv_ms connect_ms trips
for ((r = 0; r < rounds; ++r)); do
  n=${#stores[@]}
  for ((k = 0; k < n; ++k)); do
    s=${stores[$(((k + r) % n))]}
    out=$(MH_STORE=$s GZ_TEST_FULL=0 MH_TIMEOUT_S=150 "$root/tests/comm/multihost.sh" "$root/scripts/cluster.sh" \
      "$build/tools/gzrun/gzrun" "$build/tests/comm/multihost_worker" "$hosts" "$ranks" auto 2>&1) || {
      echo "$out" | tail -n 30
      echo "run_rdzv_bench: $s, round $r failed" >&2
      exit 1
    }
    line=$(echo "$out" | grep "^rendezvous ($s)")
    a=$(echo "$line" | sed -n 's/.*through after \([0-9]*\) ms.*/\1/p')
    c=$(echo "$line" | sed -n 's/.*connected after \([0-9]*\) ms.*/\1/p')
    t=$(echo "$out" | sed -n 's/^store round trips per rank: max \([0-9]*\)$/\1/p')
    printf '%-9s %5d %8d %10d %6s\n' "$s" "$r" "$a" "$c" "$t"
    rdzv[$s]+="$a "
    connect[$s]+="$c "
    [ -n "${CSV:-}" ] && echo "$s,$r,$a,$c,$t" >>"$CSV"
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : int((v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
echo "# medians (ratio to tcp)"
base_a=$(echo "${rdzv[tcp]:-}" | median)
base_c=$(echo "${connect[tcp]:-}" | median)
for s in "${stores[@]}"; do
  a=$(echo "${rdzv[$s]}" | median)
  c=$(echo "${connect[$s]}" | median)
  if [ -n "$base_a" ] && [ "$base_a" -gt 0 ]; then
    printf '%-9s rdzv %6d ms (%.2fx)  connect %6d ms (%.2fx)\n' "$s" "$a" "$(echo "$a / $base_a" | bc -l)" "$c" \
      "$(echo "$c / $base_c" | bc -l)"
  else
    printf '%-9s rdzv %6d ms  connect %6d ms\n' "$s" "$a" "$c"
  fi
done
echo "# load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
