#!/usr/bin/env bash
# Checks that cairn and llama.cpp continue a prompt identically (greedy) on the same
# synthetic GGUF files, for each architecture and a K-quant mix: a check of the file
# writer, the architectures' semantics and the tokenizer against the reference.
# Mixtures of experts (qwen3moe, llama with experts as Mixtral, gpt-oss): on F32 and F16 files
# 32 tokens from each of several prompts must be the same; on quantized files the
# count of equal leading tokens is shown (the router's top-k can flip on rounding).
# RoPE scaling past a model's original context (YaRN, Llama 3) is checked on next-token
# log-probabilities by bench/agree_rope.py: greedy loops of random models hardly see it.
# (bench/quant_close.sh measures how close each engine stays to F16 on quantized files.)
#   usage: bench/agree.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$(nproc)" --target cairn >/dev/null
ref=$(bash bench/llama_ref.sh | tail -1)
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
# Mixtures of experts: both with F32 K/V and llama.cpp without flash attention (its CPU
# flash attention rounds Q and the scores to F16, which moves logits by ~3e-4 and flips
# near ties, dense models included), through llama-server on loopback.
port=18931
prompts=("Once upon a time" "The capital of France is" "def fibonacci(n):" "1, 2, 3, 4,")
for spec in "qwen3moe-tiny f32 qwen2" "qwen3moe-tiny f16 qwen2" "mixtral-tiny f32 llama-spm" "mixtral-tiny f16 llama-spm" \
            "qwen3moe-tiny q8_0 qwen2" "qwen3moe-tiny q4_k_m qwen2" "mixtral-tiny q4_k_m llama-spm"; do
  set -- $spec
  m=build/models/$1-$2.gguf
  [ -f "$m" ] || ./build/cairn mkmodel --shape "$1" --type "$2" --vocab "$v/ggml-vocab-$3.gguf" -o "$m"
  "$ref/llama-server" -m "$m" --host 127.0.0.1 --port $port -ctk f32 -ctv f32 -fa off -t 2 -c 512 -np 1 >/dev/null 2>&1 &
  srv=$!
  for _ in $(seq 60); do curl -sf 127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
  for p in "${prompts[@]}"; do
    ours=$(./build/cairn generate -m "$m" -p "$p" -n 32 --temp 0 -ctk f32 -ctv f32 2>/dev/null)
    theirs=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "n_predict": 32, "temperature": 0,
             "top_k": 1, "cache_prompt": False}))' "$p" | curl -s 127.0.0.1:$port/completion -d @- |
             python3 -c 'import json,sys; sys.stdout.write(json.load(sys.stdin)["content"])')
    if [ "$theirs" = "$ours" ]; then
      echo "same   $1 $2 '$p' (32 tokens)"
    elif [ "$2" = f32 ] || [ "$2" = f16 ]; then
      echo "DIFFER $1 $2 '$p'"; echo "  cairn:     $ours"; echo "  llama.cpp: $theirs"; fail=1
    else
      echo "near   $1 $2 '$p' (quantized weights: the texts part after a common start)"
      echo "  cairn:     $ours"; echo "  llama.cpp: $theirs"
    fi
  done
  kill $srv; wait $srv 2>/dev/null || true
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
# gpt-oss (mkmodel's gpt-oss-tiny: qwen2 vocabulary plus the harmony tokens): attention sinks,
# biases, softmax over the router's top 4 of 8, clamped SwiGLU, layers 0 and 2 sliding over 24
# positions, YaRN; through llama-server as the MoE files above (F32 K/V, -fa off), prompts
# short and past the window. F32 and F16: 32 equal tokens; MXFP4 (experts, Q8_0 elsewhere,
# llama.cpp's MXFP4_MOE) and Q8_0: shown. Then F16 on gpt-oss's own vocabulary, o200k_harmony
# (written from js-tiktoken's ranks by tests/e2e/o200k.mjs; needs tests/e2e/node_modules).
o200k=build/models/o200k-harmony.gguf
[ -f "$o200k" ] || node tests/e2e/o200k.mjs "$o200k" >/dev/null || o200k=""
for t in f32 f16 mxfp4 q8_0 ${o200k:+f16-o200k}; do
  m=build/models/gpt-oss-tiny-$t.gguf
  vocab=$v/ggml-vocab-qwen2.gguf
  [ "$t" = f16-o200k ] && vocab=$o200k
  [ -f "$m" ] || ./build/cairn mkmodel --shape gpt-oss-tiny --type "${t%-o200k}" --vocab "$vocab" -o "$m"
  "$ref/llama-server" -m "$m" --host 127.0.0.1 --port $port -ctk f32 -ctv f32 -fa off -t 2 -c 1024 -np 1 >/dev/null 2>&1 &
  srv=$!
  for _ in $(seq 60); do curl -sf 127.0.0.1:$port/health >/dev/null && break; sleep 0.5; done
  for p in "${prompts[@]}" "$long1" "$long2" "$long3"; do
    ours=$(./build/cairn generate -m "$m" -p "$p" -n 32 --temp 0 -ctk f32 -ctv f32 2>/dev/null)
    theirs=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "n_predict": 32, "temperature": 0,
             "top_k": 1, "cache_prompt": False}))' "$p" | curl -s 127.0.0.1:$port/completion -d @- |
             python3 -c 'import json,sys; sys.stdout.write(json.load(sys.stdin)["content"])')
    if [ "$theirs" = "$ours" ]; then
      echo "same   gpt-oss-tiny $t (prompt of ${#p} chars, 32 tokens)"
    elif [ "$t" = f32 ] || [ "${t%-o200k}" = f16 ]; then
      echo "DIFFER gpt-oss-tiny $t (prompt of ${#p} chars)"; echo "  cairn:     $ours"; echo "  llama.cpp: $theirs"; fail=1
    else
      echo "near   gpt-oss-tiny $t (prompt of ${#p} chars; quantized weights: the texts part after a common start)"
      echo "  cairn:     $ours"; echo "  llama.cpp: $theirs"
    fi
  done
  kill $srv; wait $srv 2>/dev/null || true
done
exit $fail
