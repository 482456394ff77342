#!/usr/bin/env bash
# llama.cpp for side-by-side figures: ../shared/tools/llama-ref.sh builds it (outside the
# project, never committed) with AVX-VNNI on, whose VEX-encoded VPDPBUSD an AVX-512 CPU
# without AVX-VNNI (AMD Zen 4) does not have: llama-bench dies there with SIGILL in
# ggml's repacked Q4_0 GEMV. On such a CPU this builds the same source again beside it
# with AVX-VNNI off (AVX-512 VNNI stays on) and prints that folder instead.
#   usage: bench/llama_ref.sh     (prints the folder that holds llama-bench, llama-server, ...)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$(bash "$here/../shared/tools/llama-ref.sh" | tail -1)
if [ "$(uname -m)" != x86_64 ] || grep -qw avx_vnni /proc/cpuinfo; then
  echo "$bin"; exit 0
fi
src=$(dirname "$(dirname "$bin")")   # .../llama.cpp
out=$src/build-noavxvnni
if [ ! -x "$out/bin/llama-bench" ]; then
  log=$src/build-noavxvnni.log
  cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=OFF \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >"$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }
  cmake --build "$out" -j"$(nproc)" --target llama-bench llama-batched-bench llama-simple llama-server \
    llama-speculative-simple llama-tokenize llama-quantize >>"$log" 2>&1 || { tail -30 "$log" >&2; exit 1; }
fi
echo "$out/bin"
