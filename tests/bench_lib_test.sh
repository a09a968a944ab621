#!/usr/bin/env bash
# bench/lib/stats.sh: the statistics and inputs the benchmark scripts share (their tables in
# docs/benchmarks.md come from these functions).   bench_lib_test.sh STATS_SH
set -euo pipefail
# shellcheck source=/dev/null
. "$1"
fails=0
expect() {  # expect WHAT GOT WANT
  if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); fi
}
expect "median of an odd count is the middle value" "$(median "3 1 2")" 2
expect "median of an even count averages the middle two" "$(median "4 1 3 2")" 2.5000
expect "median sorts numerically" "$(median "10 9 100")" 10
expect "median ignores extra spaces" "$(median " 5  7 ")" 6.0000
expect "median of nothing is nan" "$(median "")" nan
expect "median's places follow BENCH_DECIMALS" "$(BENCH_DECIMALS=2 median "1 2")" 1.50
expect "span" "$(span "0.9 1.2 1.05")" "0.9 to 1.2"
expect "ratios per position" "$(ratios "2 3 nan" "4 2 1")" "0.5000 1.5000 nan"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
{
  echo '{"kind":"train","step":5,"time":10.0}'
  echo '{"kind":"eval","step":5,"time":11.0}'
  echo '{"kind":"train","step":10,"time":12.0}'
  echo '{"kind":"train","step":25,"time":15.0}'
} >"$d/history.jsonl"
expect "steps/s from a step to the last train row" "$(history_steps_per_s "$d/history.jsonl" 10)" 5.0000
text_lines "$d/text"
expect "text lines: train rows" "$(wc -l <"$d/text/train.tsv")" 4000
expect "text lines: test rows" "$(wc -l <"$d/text/test.tsv")" 200
expect "text lines: label and 48 words" "$(awk -F'[\t ]' '{print NF}' "$d/text/train.tsv" | sort -u)" 50
expect "text lines: 4 labels" "$(cut -f1 "$d/text/train.tsv" | sort -u | tr '\n' ' ')" "0 1 2 3 "
cp "$d/text/train.tsv" "$d/first"
text_lines "$d/text"
expect "text lines: the same every time" "$(cmp -s "$d/first" "$d/text/train.tsv" && echo same)" same
[ "$fails" = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "PASS"
