#!/usr/bin/env bash
# Prepares .devcarry/ (ignored: add "/.devcarry/" to .git/info/exclude) for the lent GPU machine
# (docs/benchmarks.md, "First run on a GPU"): that machine has CUDA, NCCL (pip), PyTorch and
# compilers but no Debian packages and no network, so Debian 12's dev packages that the build needs
# (OpenSSL, yaml-cpp, nlohmann-json, GoogleTest/Mock, zlib, libpng, libjpeg) travel unpacked, with
# Fashion-MNIST for the training run and the scripts the device runs. About 42 MB (the device tool
# carries at most 64 MiB with the working tree).
#   bench/device/prepare.sh        then, with the device tool: run "bash .devcarry/check.sh",
#                                  carry [".devcarry"] (or .devcarry/cpu_bench.sh)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
d=$root/.devcarry
rm -rf "$d" && mkdir -p "$d/debs"
(cd "$d/debs" && apt-get download libssl-dev libssl3 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev \
  libgtest-dev libgmock-dev zlib1g-dev libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo)
for f in "$d"/debs/*.deb; do dpkg -x "$f" "$d/sysroot"; done
rm -rf "$d/debs" "$d/sysroot/usr/share/doc" "$d/sysroot/usr/share/man" "$d/sysroot/usr/src"
rm -f "$d"/sysroot/usr/lib/x86_64-linux-gnu/{libcrypto,libssl,libpng,libpng16,libjpeg,libz,libyaml-cpp}.a
mkdir -p "$d/fmnist" && cp /usr/share/datasets/fashion-mnist/* "$d/fmnist/"
cp "$root/bench/device/check.sh" "$root/bench/device/cpu_bench.sh" "$d/"
du -sh "$d"
