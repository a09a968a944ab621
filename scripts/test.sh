#!/usr/bin/env bash
# The whole test suite: bootstrap, build, ctest; the C++ package installed and examples/cpp built
# against it (and against the same install packed as a .deb); then a link-only build of the NCCL backend (where
# CUDA + NCCL are installed); then ASan+UBSan builds (the LibTorch-free layers
# with their unit tests; the LibTorch layer's DDP, Horovod-mode and trainer/resume tests) and a
# TSan build of the comm tests; then the store wire-decoder fuzz target for a while; last, what
# depends on the LibTorch version built and tested against LibTorch/PyTorch 2.6 in a Debian 13 root
# (.ci/run-libtorch2; GZ_LIBTORCH2=0 leaves it out).
# The release and TSan builds use GCC; ASan+UBSan uses clang, which keeps the layers (the reduce
# kernels' vector extensions and CPU dispatch included) building with clang too.
# Every ctest stage goes through ctest_stage, which fails when a stage selects no test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. scripts/ctest_stage.sh
# The last stage needs root (debootstrap, chroot): say so now, not after the other stages.
if [ "${GZ_LIBTORCH2:-1}" = 1 ] && [ "$(id -u)" != 0 ] && ! sudo -n true 2>/dev/null; then
  echo "test.sh: the LibTorch 2.x stage needs root or password-less sudo (debootstrap, chroot):" \
    "run as root, or leave it out with GZ_LIBTORCH2=0" >&2
  exit 1
fi
stage_start=$(date +%s)
stage_time() { echo "== $1 took $(($(date +%s) - stage_start)) s"; stage_start=$(date +%s); }
scripts/bootstrap.sh test
echo "== build (release)"
# Tests ON explicitly: build/ may have been configured by demo.sh, which leaves them out.
scripts/build.sh -DGZ_BUILD_TESTS=ON
echo "== ctest (release)"
ctest_stage build -j "${GZ_TEST_JOBS:-2}" --timeout 600
# The Python package is part of the product: its tests must have been among those (bootstrap's
# test profile installs python3-torch, python3-dev, pybind11-dev and python3-pytest).
if [ "$(ctest_count build -L python)" -eq 0 ]; then
  echo "test.sh: no Python tests ran: the package guozhuang was not built (see cmake's 'Python package' line)" >&2
  exit 1
fi
stage_time "release build + ctest"
echo "== C++ package: cmake --install, then examples/cpp built against it and run on 2 ranks under gzrun"
# What a C++ user does (README "Using it from C++"): install, find_package(Guozhuang) from another
# project, link Guozhuang::torch. Nothing of the build tree is on that project's paths.
rm -rf build/install build/example-cpp
cmake --install build --prefix "$root/build/install" >/dev/null
cmake -S examples/cpp -B build/example-cpp -DCMAKE_PREFIX_PATH="$root/build/install" >/dev/null
cmake --build build/example-cpp -j "${GZ_JOBS:-$(nproc)}" >/dev/null
ctest_stage build/example-cpp --timeout 120
# The same install as a Debian package (CPack, README): unpacked, it must serve find_package too.
rm -rf build/deb build/example-deb
mkdir -p build/deb
(cd build/deb && cpack -G DEB --config ../CPackConfig.cmake >/dev/null)
deb=$(ls build/deb/guozhuang_*.deb)
dpkg-deb -x "$deb" build/deb/root
cmake -S examples/cpp -B build/example-deb -DCMAKE_PREFIX_PATH="$root/build/deb/root/usr" >/dev/null
cmake --build build/example-deb -j "${GZ_JOBS:-$(nproc)}" >/dev/null
echo "$(basename "$deb"): $(du -h "$deb" | cut -f1), $(dpkg-deb -c "$deb" | wc -l) entries; examples/cpp against it, under its gzrun:"
ctest_stage build/example-deb --timeout 120
stage_time "C++ package + examples/cpp"
echo "== NCCL backend build (link only)"
# Compiles and links the NCCL backend and test_nccl against a CUDA + NCCL install when there is
# one (no GPU needed); test_nccl's multi-rank tests skip with their reason where no GPU is
# visible. Machines without CUDA/NCCL (a fresh Debian 12) skip the stage with a message.
find_cuda_nccl() {  # prints "<cuda prefix> <nccl prefix>", or nothing
  local p d cuda="" nccl=""
  for p in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-* /usr; do
    for d in lib64 lib lib/x86_64-linux-gnu; do
      if [ -z "$cuda" ] && [ -f "$p/include/cuda_runtime.h" ] && [ -e "$p/$d/libcudart.so" ]; then cuda=$p; fi
      if [ -z "$nccl" ] && [ -f "$p/include/nccl.h" ] && [ -e "$p/$d/libnccl.so" ]; then nccl=$p; fi
    done
  done
  for p in ${NCCL_ROOT:-} ${NCCL_HOME:-}; do
    [ -z "$nccl" ] && [ -f "$p/include/nccl.h" ] && nccl=$p
  done
  if [ -n "$cuda" ] && [ -n "$nccl" ]; then echo "$cuda $nccl"; fi
}
cuda_nccl=$(find_cuda_nccl)
if [ "${GZ_SKIP_NCCL:-0}" = 1 ]; then
  echo "skipped: GZ_SKIP_NCCL=1"
elif [ -z "$cuda_nccl" ]; then
  echo "skipped: no CUDA toolkit/NCCL at \$CUDA_HOME, /usr/local/cuda, /usr/local/cuda-*, /usr" \
       "(need include/cuda_runtime.h + libcudart.so and include/nccl.h + libnccl.so)"
else
  read -r cuda_root nccl_root <<<"$cuda_nccl"
  echo "CUDA at $cuda_root, NCCL at $nccl_root"
  cmake -S "$root" -B build-nccl-ci -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGZ_WITH_TORCH=OFF -DGZ_WITH_NCCL=ON \
    -DGZ_WITH_GLOO=OFF -DGZ_WITH_MPI=OFF -DGZ_BUILD_TESTS=ON -DCUDAToolkit_ROOT="$cuda_root" \
    -DNCCL_ROOT="$nccl_root" >/dev/null
  if ! cmake --build build-nccl-ci --target test_nccl -j "$(nproc)" >build-nccl-ci/build.log 2>&1; then
    grep -E -B2 -A6 'error|Error' build-nccl-ci/build.log | tail -n 60
    echo "NCCL backend build failed (log: build-nccl-ci/build.log)" >&2
    exit 1
  fi
  # Where no GPU is visible the multi-rank tests are skipped; print the summary and one reason.
  ctest_stage build-nccl-ci -L nccl --timeout 300 >build-nccl-ci/ctest.log 2>&1 ||
    { cat build-nccl-ci/ctest.log; exit 1; }
  grep -E 'tests passed' build-nccl-ci/ctest.log
  echo "$(grep -c '(Skipped)' build-nccl-ci/ctest.log || true) test(s) skipped"
  build-nccl-ci/tests/comm/test_nccl --gtest_filter='Nccl.InitTimesOutNamingTheMissingRank' | grep -m1 -A1 'Skipped' || true
fi
stage_time "NCCL backend build (link only)"
if [ "${GZ_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== ASan+UBSan build (clang) of core/store/comm + their tests"
  CC=clang CXX=clang++ GZ_BUILD_DIR=$root/build-asan-clang GZ_BUILD_TYPE=Debug scripts/build.sh -DGZ_WITH_TORCH=OFF \
    -DGZ_BUILD_TESTS=ON -DGZ_SANITIZE=address,undefined
  ASAN_OPTIONS=detect_leaks=1 ctest_stage build-asan-clang -j 2 -L unit --timeout 600
  stage_time "ASan+UBSan (LibTorch-free)"
  echo "== ASan+UBSan build (clang) of the LibTorch layer's DDP, Horovod-mode and trainer tests"
  # Only the targets of the tests labelled asan-torch (and the binaries test_train_restart starts);
  # -O1: the trainer tests train real models, too slow at -O0 under ASan (-O1 is what ASan's
  # authors suggest). Line tables are all a sanitizer report needs; full debug info of
  # LibTorch's templates costs ~30% of the compile.
  CC=clang CXX=clang++ GZ_BUILD_DIR=$root/build-asan-torch GZ_BUILD_TYPE=RelWithDebInfo \
    GZ_TARGETS=gz_asan_torch_tests scripts/build.sh \
    -DGZ_WITH_TORCH=ON -DGZ_BUILD_TESTS=ON -DGZ_SANITIZE=address,undefined \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -DNDEBUG"
  ASAN_OPTIONS=detect_leaks=1 ctest_stage build-asan-torch -j 2 -L asan-torch --timeout 900
  stage_time "ASan+UBSan (LibTorch layer)"
  echo "== TSan build of the comm tests"
  # Only the executables of the tests labelled tsan (target gz_tsan_tests).
  GZ_BUILD_DIR=$root/build-tsan GZ_BUILD_TYPE=RelWithDebInfo GZ_TARGETS=gz_tsan_tests scripts/build.sh \
    -DGZ_WITH_TORCH=OFF -DGZ_BUILD_TESTS=ON \
    -DGZ_SANITIZE=thread "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest_stage build-tsan -j 2 -L tsan --timeout 900
  stage_time "TSan"
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
  stage_time "fuzz"
fi
if [ "${GZ_LIBTORCH2:-1}" = 1 ]; then
  # The LibTorch layer, the trainer, the Python package and their tests (ctest -L 'torch|python')
  # again, against Debian 13's LibTorch/PyTorch 2.6 and Python 3.13 (the root is made by debootstrap
  # on a fresh machine and kept at GZ_LIBTORCH2_ROOT for the next run). The LibTorch-free layers do
  # not depend on the LibTorch version; they ran above. Costs and counts: docs/results/verification.md.
  echo "== LibTorch 2.x: Debian 13's LibTorch/PyTorch 2.6 in a root at ${GZ_LIBTORCH2_ROOT:-/var/tmp/gz-trixie}"
  .ci/run-libtorch2
  stage_time "LibTorch 2.x (Debian 13 root)"
else
  echo "== LibTorch 2.x stage left out (GZ_LIBTORCH2=0); .ci/run-libtorch2 runs it alone"
fi
echo "all test stages passed"
