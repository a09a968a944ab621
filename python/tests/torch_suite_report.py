#!/usr/bin/python3
"""Summarise torch_dist_suite.py results: counts per run, and every test that passes on gloo but not
on gz, with the reason (skip reason or the last line of the failure).

    python/tests/torch_suite_report.py DIR     (DIR holds gloo2.jsonl, gz2.jsonl, gzg2.jsonl, ... 3)
gz = plugin mode; gzg = --as-gloo mode (the suite told it runs gloo, every group is gz).
"""
import json
import os
import sys


def load(path):
    if not os.path.exists(path):
        return None
    out = {}
    for line in open(path):
        d = json.loads(line)
        out[d["test"]] = d
    return out


def reason(d):
    if d is None:
        return "not run"
    text = d["reason"].strip()
    if d["outcome"] == "skip":
        return "skipped: " + text
    lines = [x for x in text.splitlines() if x.strip() and not x.startswith(("frame #", " "))]
    for x in lines:  # our own message first
        if "gz backend" in x or "gz store" in x:
            return d["outcome"] + ": " + x.strip()[:300]
    for x in reversed(lines):
        if "Error" in x or "error" in x or "Exception" in x:
            return d["outcome"] + ": " + x.strip()[:300]
    return d["outcome"] + ": " + (lines[-1][:300] if lines else "")


def counts(res):
    c = {"pass": 0, "skip": 0, "fail": 0, "error": 0}
    for d in res.values():
        c[d["outcome"]] += 1
    return c


def main():
    root = sys.argv[1]
    for ws in (2, 3):
        runs = {k: load(os.path.join(root, f"{k}{ws}.jsonl")) for k in ("gloo", "gz", "gzg")}
        print(f"\n### World size {ws}\n")
        print("| run | tests | pass | skip | fail + error |")
        print("|---|---|---|---|---|")
        names = {"gloo": "gloo (reference)", "gz": "gz (plugin)", "gzg": "gz, suite told \"gloo\""}
        for k, res in runs.items():
            if res:
                c = counts(res)
                print(f"| {names[k]} | {len(res)} | {c['pass']} | {c['skip']} | {c['fail'] + c['error']} |")
        gloo = runs["gloo"] or {}
        for k in ("gz", "gzg"):
            res = runs[k]
            if not res:
                continue
            missing = [t for t, d in sorted(gloo.items()) if d["outcome"] == "pass" and res.get(t, {}).get("outcome") != "pass"]
            print(f"\nPass on gloo, not on {names[k]} ({len(missing)}):\n")
            for t in missing:
                print(f"- `{t}`: {reason(res.get(t))}")
            extra = [t for t, d in sorted(res.items()) if d["outcome"] in ("fail", "error")
                     and gloo.get(t, {}).get("outcome") != "pass"]
            if extra:
                print(f"\nAlso failing on {names[k]} (not passing on gloo either): "
                      + ", ".join(f"`{t}`" for t in extra))


if __name__ == "__main__":
    main()
