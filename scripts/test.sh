#!/usr/bin/env bash
# Builds cairn twice (release, and ASan+UBSan) and runs the whole test suite on both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && CAIRN_SANITIZED=1 ctest --output-on-failure -j"$jobs")
