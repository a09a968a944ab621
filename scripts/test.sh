#!/usr/bin/env bash
# The whole test suite: bootstrap, build, ctest; then ASan+UBSan and TSan builds of the
# LibTorch-free layers with their tests; then the store wire-decoder fuzz target for a while.
# The release and TSan builds use GCC; ASan+UBSan uses clang, which keeps the LibTorch-free layers
# (the shm reduce kernels' vector extensions and CPU dispatch included) building with clang too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/bootstrap.sh test
echo "== build (release)"
scripts/build.sh
echo "== ctest (release)"
(cd build && ctest --output-on-failure -j "${GZ_TEST_JOBS:-2}" --timeout 600)
if [ "${GZ_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== ASan+UBSan build (clang) of core/store/comm + their tests"
  CC=clang CXX=clang++ GZ_BUILD_DIR=$root/build-asan-clang GZ_BUILD_TYPE=Debug scripts/build.sh -DGZ_WITH_TORCH=OFF \
    -DGZ_SANITIZE=address,undefined
  (cd build-asan-clang && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 -L unit --timeout 600)
  echo "== TSan build of the comm tests"
  GZ_BUILD_DIR=$root/build-tsan GZ_BUILD_TYPE=RelWithDebInfo scripts/build.sh -DGZ_WITH_TORCH=OFF -DGZ_SANITIZE=thread
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --output-on-failure -j 2 -L tsan --timeout 900)
fi
if [ "${GZ_SKIP_FUZZ:-0}" != 1 ] && [ -f fuzz/CMakeLists.txt ]; then
  echo "== fuzz the store wire decoder (${GZ_FUZZ_SECONDS:-30} s)"
  # The fuzz target needs only gz_store: build just that target with clang (libFuzzer).
  CC=clang CXX=clang++ cmake -S "$root" -B build-fuzz -DGZ_WITH_TORCH=OFF -DGZ_BUILD_TESTS=OFF \
    -DGZ_BUILD_FUZZ=ON -DGZ_WITH_GLOO=OFF -DGZ_WITH_MPI=OFF >/dev/null
  cmake --build build-fuzz --target fuzz_store_wire -j "$(nproc)" >/dev/null
  # New inputs go to a scratch corpus and crash files under build-fuzz/, never into the repo.
  mkdir -p build-fuzz/corpus
  build-fuzz/fuzz/fuzz_store_wire -max_total_time="${GZ_FUZZ_SECONDS:-30}" -print_final_stats=1 \
    -artifact_prefix=build-fuzz/ build-fuzz/corpus fuzz/corpus 2>&1 | tail -n 4
fi
echo "all test stages passed"
