#!/usr/bin/env bash
# The straggler report's fault matrix: REPEATS runs (default 5) per row, each with a random
# victim, on the simulated cluster (4 hosts x 2 ranks, DDP over hier(shm+gloo), links at 1 Gbit/s):
#   data     one rank's data phase 200 ms slower per step (test-only GZ_TEST_SLOW_DATA_MS)
#   compute  one rank's process under a cgroup v1 CPU quota (2% of a core)
#   link     one host's link shaped to 100 Mbit/s (1/10)
#   none     healthy: nobody may be named (false alarms)
# A run counts as correct when rank 0's first straggler warning names the victim and the cause by
# step 50 (none: no warning at all). Needs root. Prints one table; the runs' RESULT lines go to a log.
#   bench/run_straggler_matrix.sh [BUILD_DIR]     env: REPEATS (5), ROWS ("data compute link none")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${GZ_BUILD_DIR:-$root/build}}
REPEATS=${REPEATS:-5}
ROWS=${ROWS:-"data compute link none"}
log=$(mktemp -d)/straggler_matrix.log
echo "log: $log (load at start: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
declare -A ok runs named
for ((k = 1; k <= REPEATS; ++k)); do
  for row in $ROWS; do  # interleaved: a slow phase of the machine hits every row alike
    out=$("$root/tests/train/multihost_straggler.sh" "$root/scripts/cluster.sh" "$build/tools/gzrun/gzrun" \
      "$build/apps/gz-train/gz-train" "$row" 2>&1)
    rc=$?
    [ $rc = 77 ] && { echo "$out" | tail -1; exit 77; }
    echo "== $row run $k (exit $rc)" >>"$log"
    echo "$out" >>"$log"
    r=$(echo "$out" | grep '^RESULT ' | tail -1)
    [ -n "$r" ] || r="RESULT row=$row victim=? named=? step=- ok=0"
    echo "$r" >&2
    runs[$row]=$((${runs[$row]:-0} + 1))
    echo "$r" | grep -q ' ok=1' && ok[$row]=$((${ok[$row]:-0} + 1))
    v=$(echo "$r" | sed -n 's/.* victim=\([^ ]*\) .*step=\([^ ]*\) .*/\1@\2/p')
    named[$row]="${named[$row]:-}${named[$row]:+ }$v"
  done
done
echo
echo "| row | correct | victims (@ step named) |"
echo "|---|---|---|"
total=0 good=0
for row in $ROWS; do
  echo "| $row | ${ok[$row]:-0}/${runs[$row]:-0} | ${named[$row]:-} |"
  total=$((total + ${runs[$row]:-0}))
  good=$((good + ${ok[$row]:-0}))
done
echo "| all | $good/$total | |"
echo "(load at end: $(cut -d' ' -f1-3 /proc/loadavg); log $log)"
