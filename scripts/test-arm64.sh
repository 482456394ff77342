#!/usr/bin/env bash
# Builds cairn for Linux ARM64 on an x86-64 Debian 12 machine and tests it under
# qemu-user (no ARM hardware needed):
#   1. installs what it needs (root or sudo): Debian's gcc-aarch64-linux-gnu, qemu-user,
#      and the arm64 libraries of the dependencies (Debian multiarch: dpkg
#      --add-architecture arm64). libczmq-dev is not multiarch in Debian 12 (its arm64
#      package would remove the host's), so only libczmq4:arm64 is installed and the
#      toolchain file names it (cmake/aarch64-linux-gnu.cmake);
#   2. builds the host (x86-64) binaries it compares with, in build/ (targets cairn and
#      test_forward_bits only), and cross-builds everything into build-arm64/;
#   3. writes the x86-64 logits hashes of test_forward_bits to build-arm64/, then runs the
#      ctest label arm64 there (kernels on every NEON path against the reference, forward
#      passes and their bits against x86-64, tokenizers, templates, control plane), each
#      test under qemu-aarch64 -cpu max (NEON, dot product, i8mm, fp16) with a time bound;
#   4. runs a mixed pipeline: an x86-64 node and an ARM64 node under qemu, linked over
#      loopback, must answer greedy prompts with the same tokens as the x86-64 node alone
#      (scripts/arm64_pipeline.py).
# Exits non-zero if anything fails. CAIRN_ARM64_JOBS sets the parallel jobs (nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${CAIRN_ARM64_JOBS:-$(nproc)}

# ---- 1. packages ----
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
bash scripts/deps.sh  # the host's own build dependencies
dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
pkgs=(gcc-aarch64-linux-gnu qemu-user libc6:arm64 libjansson-dev:arm64 libpcre2-dev:arm64
      libzmq3-dev:arm64 libczmq4:arm64 libsodium-dev:arm64 libmicrohttpd-dev:arm64
      libsqlite3-dev:arm64 libcurl4-openssl-dev:arm64 libssl-dev:arm64 libedit-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  # --no-remove: never take away a host package (as libczmq-dev:arm64 would)
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-remove "${missing[@]}"
fi
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)

# ---- 2. builds ----
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build build -j"$jobs" --target cairn test_forward_bits
cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-arm64 -j"$jobs"
readelf -h build-arm64/cairn | grep -q AArch64 || { echo "build-arm64/cairn is not an ARM64 binary" >&2; exit 1; }

# ---- 3. unit tests under qemu, with the host's logits to compare with ----
host_bits=build-arm64/forward_bits_host.txt
(cd build && ./test_forward_bits) | grep '^forward-bits ' > "$host_bits.tmp"
[ "$(wc -l < "$host_bits.tmp")" -ge 18 ] || { echo "test_forward_bits on the host failed" >&2; exit 1; }
mv "$host_bits.tmp" "$host_bits"
(cd build-arm64 && timeout 5400 ctest -L arm64 -j"$jobs" --output-on-failure)

# ---- 4. the mixed pipeline ----
timeout 900 python3 scripts/arm64_pipeline.py "$PWD/build/cairn" "$PWD/build-arm64/cairn" "$qemu" \
  "$(cd .. && pwd)/shared/testdata/vocab/ggml-vocab-llama-spm.gguf"
echo "test-arm64: all passed"
