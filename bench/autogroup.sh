# Sourced by benchmark scripts right after `set -euo pipefail`: run the rest of the script in a
# session of its own whose autogroup nice is AUTOGROUP_NICE (default -20; "off" leaves it alone).
# With kernel.sched_autogroup_enabled=1 the scheduler shares CPU between sessions first, so another
# session's build takes as much as the benchmark whatever its `nice`; this gives the benchmark what
# nice 19 on the others was meant to leave it. Re-executes "$0" with the script's arguments.
AUTOGROUP_NICE=${AUTOGROUP_NICE:--20}
if [ "$AUTOGROUP_NICE" != off ] && [ -z "${GZ_BENCH_SESSION:-}" ] && [ -w /proc/self/autogroup ]; then
  GZ_BENCH_SESSION=1 exec setsid --wait "$0" "$@"
fi
if [ -n "${GZ_BENCH_SESSION:-}" ]; then
  echo "$AUTOGROUP_NICE" >/proc/self/autogroup 2>/dev/null || echo "warning: cannot set the autogroup nice" >&2
  echo "autogroup: $(cat /proc/self/autogroup)" >&2
fi
