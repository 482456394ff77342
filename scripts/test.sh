#!/usr/bin/env bash
# Builds cairn twice (release, and ASan+UBSan) and runs the whole test suite on both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
# The client packages of the end-to-end tests (pinned in tests/e2e/package-lock.json).
if command -v npm >/dev/null 2>&1; then
  (cd tests/e2e && npm ci --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null) ||
    { echo "npm ci in tests/e2e failed" >&2; exit 1; }
else
  echo "npm is missing: the e2e tests will be skipped" >&2
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && CAIRN_SANITIZED=1 ctest --output-on-failure -j"$jobs")
