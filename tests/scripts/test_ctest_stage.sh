#!/usr/bin/env bash
# Self-test of scripts/ctest_stage.sh: a stage that selects no test must fail, one that selects
# some must count them. Args: path of ctest_stage.sh, a build directory with tests.
set -uo pipefail
. "$1"
build=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

n=$(ctest_count "$build" -L unit)
[ "$n" -gt 0 ] || fail "ctest_count found no unit tests in $build"

ctest_stage "$build" -L gz-no-such-label >/dev/null 2>&1 && fail "an empty label passed"

# A build configured without tests: ctest says "No tests were found!!!" and exits 0.
empty=$(mktemp -d)
trap 'rm -rf "$empty"' EXIT
: >"$empty/CTestTestfile.cmake"
(cd "$empty" && ctest >/dev/null 2>&1) || fail "premise: ctest in an empty build should exit 0"
ctest_stage "$empty" >/dev/null 2>&1 && fail "a build without tests passed"
echo "ok: empty stages fail, $n unit tests counted"
