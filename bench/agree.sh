#!/usr/bin/env bash
# Checks that cairn and llama.cpp continue a prompt identically (greedy) on the same
# synthetic GGUF files, for each architecture and a K-quant mix: a check of the file
# writer, the architectures' semantics and the tokenizer against the reference.
#   usage: bench/agree.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$(nproc)" --target cairn >/dev/null
ref=$(bash ../shared/tools/llama-ref.sh | tail -1)
v=../shared/testdata/vocab
mkdir -p build/models
fail=0
for spec in "llama-1b q8_0 llama-bpe" "llama-1b q4_k_m llama-bpe" "qwen-0.5b q4_k_m qwen2" "qwen3-0.6b q8_0 qwen2" "small q4_0 llama-spm"; do
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
# gemma3 and phi3 on F32 and F16 files: 32 tokens from several prompts, all but the first
# two longer than gemma3-tiny's sliding window of 24 positions, the last longer than a tile of
# 256 positions. llama.cpp prints a lone byte token as the byte, cairn as U+FFFD: its text is
# decoded the same way before comparing. (A prompt whose continuation met a near tie, two
# logits 4e-4 apart in the float64 reference, was replaced: no engine is bound to agree there.)
utf8() { python3 -c 'import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", "replace"))'; }
long1="In the middle of the night, the train stopped at a small station where nobody ever got off, and a woman with a red suitcase stepped onto the platform and"
long2="Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize foods from carbon dioxide and water. It generally involves"
long3=$(for i in $(seq 1 24); do printf 'Step %d of the recipe: stir the pot slowly. ' "$i"; done)
for spec in "gemma3-tiny f32" "gemma3-tiny f16" "phi3-tiny f32" "phi3-tiny f16"; do
  set -- $spec
  m=build/models/$1-$2.gguf
  [ -f "$m" ] || ./build/cairn mkmodel --shape "$1" --type "$2" --vocab "$v/ggml-vocab-llama-spm.gguf" -o "$m"
  for prompt in "Once upon a time" "def fibonacci(n):" "$long1" "$long2" "$long3"; do
    ours=$(./build/cairn generate -m "$m" -p "$prompt" -n 32 --temp 0 2>/dev/null)
    theirs=$("$ref/llama-simple" -m "$m" -n 32 "$prompt" 2>/dev/null | utf8)
    if [ "$theirs" = "<s> $prompt$ours" ] || [ "$theirs" = "$prompt$ours" ]; then
      echo "same   $1 $2 (prompt of ${#prompt} chars)"
    else
      echo "DIFFER $1 $2 (prompt of ${#prompt} chars)"; echo "  cairn:     $ours"; echo "  llama.cpp: $theirs"; fail=1
    fi
  done
done
exit $fail
