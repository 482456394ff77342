#!/usr/bin/env bash
# Checks that cairn and llama.cpp continue a prompt identically (greedy) on the same
# synthetic GGUF files, for each architecture and a K-quant mix: a check of the file
# writer, the architectures' semantics and the tokenizer against the reference.
# (bench/quant_close.sh measures how close each engine stays to F16 on quantized files.)
#   usage: bench/agree.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$(nproc)" --target cairn >/dev/null
ref=$(bash ../shared/tools/llama-ref.sh | tail -1)
v=../shared/testdata/vocab
mkdir -p build/models
fail=0
for spec in "llama-1b q8_0 llama-bpe" "llama-1b q4_k_m llama-bpe" "qwen-0.5b q4_k_m qwen2" "qwen3-0.6b q8_0 qwen2" "small q4_0 llama-spm" \
            "small q2_k llama-spm" "small iq4_nl llama-spm" "small iq4_xs llama-spm"; do
  set -- $spec
  m=build/models/$1-$2.gguf
  [ -f "$m" ] || ./build/cairn mkmodel --shape "$1" --type "$2" --vocab "$v/ggml-vocab-$3.gguf" -o "$m"
  ours=$(./build/cairn generate -m "$m" -p "Once upon a time" -n 16 --temp 0 2>/dev/null)
  theirs=$("$ref/llama-simple" -m "$m" -n 16 "Once upon a time" 2>/dev/null)
  if [ "$theirs" = "Once upon a time$ours" ] || [ "$theirs" = "<|begin_of_text|>Once upon a time$ours" ] || [ "$theirs" = "<s> Once upon a time$ours" ]; then
    echo "same   $1 $2"
  else
    echo "DIFFER $1 $2"; echo "  cairn:     $ours"; echo "  llama.cpp: $theirs"; fail=1
  fi
done
exit $fail
