#!/usr/bin/env bash
# Install what Guozhuang needs on Debian 12 (idempotent; quiet when everything is present).
#   scripts/bootstrap.sh          build + demo dependencies
#   scripts/bootstrap.sh test     + test tools (clang for the fuzz target and the ASan+UBSan build, iproute2 for netns
#                                   tests) and the Python package's build and test dependencies
#   scripts/bootstrap.sh bench    + python3-torch for the PyTorch DDP comparison
#   scripts/bootstrap.sh libtorch2  what the LibTorch 2.x stage's tests need (ctest -L 'torch|python'):
#                                   test's packages less clang and etcd (none of those tests use them)
#   scripts/bootstrap.sh python   + what `pip install --no-build-isolation ./python` needs (Debian's torch,
#                                   headers, pybind11, pip, setuptools, wheel: nothing from PyPI)
set -euo pipefail
pkgs=(g++ cmake make git ca-certificates pkg-config ccache
      libtorch-dev libopenblas0-openmp libgloo-dev libopenmpi-dev openmpi-bin
      libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev libpng-dev libjpeg-dev dataset-fashion-mnist procps
      libssl-dev)  # libssl-dev: the store handshake's HMAC, https to etcd
for profile in "$@"; do
  case "$profile" in
    test) pkgs+=(libgtest-dev clang libclang-rt-dev iproute2 python3
                 python3-torch python3-dev pybind11-dev python3-pytest  # + the Python package
                 python3-pip python3-setuptools python3-wheel  # + its pip wheel (test_package.py)
                 etcd-server etcd-client) ;;  # the etcd store's tests (members started by the tests)
    libtorch2) pkgs+=(libgtest-dev iproute2 python3 python3-torch python3-dev pybind11-dev python3-pytest
                      python3-pip python3-setuptools python3-wheel) ;;
    python) pkgs+=(python3 python3-torch python3-dev pybind11-dev python3-pip python3-setuptools python3-wheel) ;;
    bench) pkgs+=(python3-torch python3-matplotlib iproute2 etcd-server) ;;  # etcd: bench/run_rdzv_bench.sh
    *) echo "bootstrap: unknown profile '$profile' (expected: test, libtorch2, bench, python)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "bootstrap: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's libtorch calls whatever BLAS the alternatives point at; the reference BLAS is ~13x slower.
if [ "$(id -u)" = 0 ]; then
  for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
    cand=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas | head -n1 || true)
    [ -n "$cand" ] && update-alternatives --set "$alt" "$cand" >/dev/null 2>&1 || true
  done
fi
exit 0
