#!/usr/bin/env bash
# How close each engine's quantized path stays to its own F16 path, on the same files:
# for each type, cairn mkmodel writes the model (same seed) in F16 and in that type;
# cairn and llama.cpp (llama-simple) each continue several prompts greedily for 32 tokens
# on both files, and the length of the common prefix of the quantized continuation with
# the engine's F16 continuation is summed over the prompts (in characters of text).
# cairn's quantized path should stay at least as close as llama.cpp's. Also prints
# whether the two engines continue identically on the quantized file.
#   usage: [PROMPTS=N] bench/quant_close.sh [SHAPE] [TYPES...]   (default: small, the new
#   types, the first 5 of the 16 prompts)
# Qwen and gpt-oss shapes take the Qwen2 vocabulary (gpt-oss's with the harmony tokens),
# the others Llama's SentencePiece one.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=$(bash bench/llama_ref.sh | tail -1)
cmake --build build -j2 --target cairn >/dev/null
shape=${1:-small}; shift || true
types=${*:-q2_k q3_k iq4_nl iq4_xs mxfp4 q4_k q4_0}
case $shape in
  qwen*|gpt-oss*) v=../shared/testdata/vocab/ggml-vocab-qwen2.gguf ;;
  *) v=../shared/testdata/vocab/ggml-vocab-llama-spm.gguf ;;
esac
out=build/models; mkdir -p "$out"
prompts=("Once upon a time" "The capital of France is" "def fibonacci(n):" "In 1492, Columbus" "My favourite food is"
  "The weather today" "SELECT * FROM users WHERE" "Dear Sir or Madam," "The quick brown fox" "To be or not to be"
  "import numpy as np" "Water boils at" "The first rule of" "Ladies and gentlemen," "In the beginning" "Hello, my name is")
prompts=("${prompts[@]:0:${PROMPTS:-5}}")
mk() { [ -f "$out/$shape-$1.gguf" ] || ./build/cairn mkmodel --shape "$shape" --type "$1" --vocab "$v" -o "$out/$shape-$1.gguf" >/dev/null; }
ours() { ./build/cairn generate -m "$out/$shape-$1.gguf" -p "$2" -n 32 --temp 0 2>/dev/null; }
theirs() { "$ref/llama-simple" -m "$out/$shape-$1.gguf" -n 32 "$2" 2>/dev/null | sed -e 's/^<s> //' -e 's/^<|begin_of_text|>//' | cut -c$((${#2} + 1))-; }
prefix() { python3 -c 'import sys,os; a,b=sys.argv[1],sys.argv[2]; print(len(os.path.commonprefix([a,b])))' "$1" "$2"; }
mk f16
declare -a of16 tf16
for i in "${!prompts[@]}"; do of16[$i]=$(ours f16 "${prompts[$i]}"); tf16[$i]=$(theirs f16 "${prompts[$i]}"); done
printf "%-8s %22s %22s %s\n" type "cairn: F16 prefix" "llama.cpp: F16 prefix" "same text on the file"
for t in $types; do
  mk "$t"
  oc=0; tc=0; tot=0; same=0
  for i in "${!prompts[@]}"; do
    o=$(ours "$t" "${prompts[$i]}"); th=$(theirs "$t" "${prompts[$i]}")
    oc=$((oc + $(prefix "$o" "${of16[$i]}"))); tc=$((tc + $(prefix "$th" "${tf16[$i]}")))
    tot=$((tot + ${#of16[$i]})); [ "$o" = "$th" ] && same=$((same + 1))
  done
  printf "%-8s %16s/%-5s %16s/%-5s %d of %d prompts\n" "$t" "$oc" "$tot" "$tc" "$tot" "$same" "${#prompts[@]}"
done
