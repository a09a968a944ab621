# Sourced by the benchmark scripts: the few statistics and inputs they share, written once.
# Plain functions of their arguments (no state but BENCH_DECIMALS); tests/bench_lib_test.sh checks
# each of them.

# Places an even-count median is printed with (an odd count prints the middle value as given).
BENCH_DECIMALS=${BENCH_DECIMALS:-4}

# median "V1 V2 ...": the median of the numbers ("nan" when there are none).
median() {
  tr ' ' '\n' <<<"$1" | { grep -v '^$' || true; } | sort -g | awk -v d="$BENCH_DECIMALS" '{a[NR]=$1} END {
    if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else printf "%.*f\n", d, (a[NR/2]+a[NR/2+1])/2}'
}

# span "V1 V2 ...": "LOWEST to HIGHEST".
span() { tr ' ' '\n' <<<"$1" | { grep -v '^$' || true; } | sort -g | awk 'NR == 1 {lo=$1} {hi=$1} END {print lo " to " hi}'; }

# ratios "A1 A2 ..." "B1 B2 ...": "A1/B1 A2/B2 ..." with 4 places; "nan" where either is nan.
ratios() {
  awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); split(b, y, " ");
    for (i = 1; i <= n; ++i) printf "%s%s", (i > 1 ? " " : ""), (x[i] == "nan" || y[i] == "nan") ? "nan" : sprintf("%.4f", x[i] / y[i]) }'
}

# history_steps_per_s HISTORY_JSONL FROM_STEP: optimizer steps per second between the "train" row of
# step FROM_STEP and the last "train" row of gz-train's history.jsonl (set-up, the first steps and
# the final evaluation left out).
history_steps_per_s() {
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in rows if r["kind"] == "train"]
a = next(r for r in train if r["step"] == int(sys.argv[2]))
b = train[-1]
print("%.4f" % ((b["step"] - a["step"]) / (b["time"] - a["time"])))
PY
}

# text_lines DIR: DIR/train.tsv (4000 lines) and DIR/test.tsv (200) of "label<TAB>48 words", 4
# classes, a fixed seed: bert_small's input for gz-train --dataset text_lines.
text_lines() {
  mkdir -p "$1"
  awk -v dir="$1" 'BEGIN { srand(7); for (f = 0; f < 2; ++f) { n = f ? 200 : 4000;
    out = dir "/" (f ? "test.tsv" : "train.tsv");
    for (i = 0; i < n; ++i) { c = int(rand() * 4); line = c "\t";
      for (w = 0; w < 48; ++w) line = line sprintf("w%d ", int(rand() * 500) + 500 * (rand() < 0.3 ? c : 0));
      print line > out } } }'
}
