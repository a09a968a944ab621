#!/usr/bin/env bash
# The flight recorder's fault matrix, RUNS (default 5) runs per row with random victims, on the
# simulated cluster (4 hosts x 2 ranks): SIGSTOP of a worker, a skipped collective, a mismatched
# collective, a killed node, a pulled cable, a killed worker, a hang in data loading, --status on
# a stopped worker
# (tests/launcher/flight_faults.sh). Prints every run's
# verdict and the count of correct verdicts per row and in total.
#   bench/run_flight_faults.sh [BUILD_DIR]     env: RUNS, SEED, ROWS (default: all eight rows)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
runs=${RUNS:-5}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores), $(git -C "$root" rev-parse --short HEAD), $(date -u +%F)"
total=0 correct=0
for row in ${ROWS:-stop skip mismatch killnode link kill hang status}; do
  out=$("$root/tests/launcher/flight_faults.sh" "$root/scripts/cluster.sh" "$build/tools/gzrun/gzrun" \
    "$build/tests/launcher/flight_fault_worker" "$row" "$runs" 2>&1)
  rc=$?
  [ $rc = 77 ] && { echo "$out" | tail -1; exit 77; }
  echo "$out" | grep -E "^(PASS|FAIL|RESULT)"
  ok=$(echo "$out" | sed -n 's/^RESULT flight_faults .* correct=\([0-9]*\) .*/\1/p')
  correct=$((correct + ${ok:-0})) total=$((total + runs))
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "RESULT flight_faults_total correct=$correct runs=$total"
