#!/usr/bin/env bash
# gz-bench train --zero 3 [--no-prefetch]: the RESULT line records fully_shard's prefetch as the
# strategy was built with it (read back from FullyShardOptions, not echoed from the flag), so a
# benchmark script can tell its rows apart; --no-prefetch below stage 3 is refused.
#   bench_train_prefetch.sh GZRUN GZ_BENCH
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: bench_train_prefetch.sh GZRUN GZ_BENCH" >&2; exit 2; }
gzrun=$1 bench=$2
export GZ_TIMEOUT_S=60
# run EXPECT ARGS...: 2 ranks, one short step of the cnn; the RESULT line must say prefetch=EXPECT.
run() {
  local want=$1 out
  shift
  out=$(timeout -k 5 120 "$gzrun" --nproc-per-node 2 --master-port 0 -- "$bench" train --model cnn \
    --batch 4 --steps 1 --warmup 1 "$@" 2>&1) || { echo "$out" | tail -n 20; echo "FAIL: gz-bench train $*"; exit 1; }
  # gzrun prefixes each line with its rank: "[0] RESULT ...".
  grep -qE "^(\[0\] )?RESULT .* prefetch=$want\$" <<<"$out" ||
    { echo "$out" | tail -n 20; echo "FAIL: gz-bench train $*: no RESULT line with prefetch=$want"; exit 1; }
  grep -qE "^(\[0\] )?gz-bench train: .* prefetch=$want\$" <<<"$out" ||
    { echo "$out" | tail -n 20; echo "FAIL: gz-bench train $*: no config line with prefetch=$want"; exit 1; }
}
run on --zero 3
run off --zero 3 --no-prefetch
run n/a --zero 2
if out=$("$bench" train --zero 2 --no-prefetch 2>&1); then
  echo "FAIL: --no-prefetch with --zero 2 was accepted"; exit 1
fi
grep -q -- "--no-prefetch needs --zero 3" <<<"$out" || { echo "$out"; echo "FAIL: no clear refusal"; exit 1; }
echo "PASS: prefetch=on|off|n/a recorded as built; --no-prefetch below stage 3 refused"
