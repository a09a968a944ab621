# Sourced by test.sh: run one ctest stage, and fail it when it selects no test at all. ctest
# itself exits 0 on "No tests were found!!!", which once let a build configured with
# GZ_BUILD_TESTS=OFF (scripts/demo.sh) pass every stage of test.sh without running anything.

# ctest_count DIR ARGS...: how many tests `ctest ARGS` would run in DIR (0 when none or unknown).
ctest_count() {
  local dir=$1
  shift
  (cd "$dir" && ctest -N "$@" 2>/dev/null) | awk '/^Total Tests:/ {n = $3} END {print n + 0}'
}

# ctest_stage DIR ARGS...: ctest --output-on-failure ARGS in DIR; an empty selection fails.
ctest_stage() {
  local dir=$1
  shift
  local n
  n=$(ctest_count "$dir" "$@")
  if [ "$n" -eq 0 ]; then
    echo "ctest_stage: no tests selected in $dir by 'ctest $*' (built with GZ_BUILD_TESTS=OFF, or a wrong label?)" >&2
    return 1
  fi
  echo "ctest_stage: $n tests in $dir ($*)"
  (cd "$dir" && ctest --output-on-failure "$@")
}
