#!/usr/bin/env bash
# Builds cairn, writes a synthetic model of Llama-3.2-1B's shape (seeded random weights,
# Llama 3's real vocabulary), generates from it and measures it. Nothing is downloaded.
#   usage: scripts/quickstart.sh [SHAPE] [TYPE]      (default: llama-1b q4_0)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target cairn
shape=${1:-llama-1b}; type=${2:-q4_0}
vocab=../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf
case "$shape" in qwen*) vocab=../shared/testdata/vocab/ggml-vocab-qwen2.gguf ;; tiny|small) vocab=../shared/testdata/vocab/ggml-vocab-llama-spm.gguf ;; esac
model=build/models/$shape-$type.gguf
mkdir -p build/models
[ -f "$model" ] || ./build/cairn mkmodel --shape "$shape" --type "$type" --vocab "$vocab" -o "$model"
./build/cairn generate -m "$model" -p "The cairn on the hill" -n 32 --seed 7 --temp 0.8 --top-p 0.9 -t "$(nproc)"
./build/cairn bench -m "$model" -p 128 -n 32 -r 2 --batch-curve 8 -t "$(nproc)"
