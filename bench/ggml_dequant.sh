#!/usr/bin/env bash
# Checks cairn's dequantization of Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 against ggml's on
# whole GGUF files: files that llama.cpp's llama-quantize made from a cairn F32 model, and
# files cairn's own quantizers made (cairn mkmodel --type). bench/ggml_dequant.c, built
# here against llama.cpp's libggml only, writes ggml's dequantization of every tensor of
# those types; test_ggml_dequant compares cairn's bit for bit.
#   usage: bench/ggml_dequant.sh [SHAPE]        (default: small)
#          bench/ggml_dequant.sh --vectors       rewrite tests/kern/data/ggml_dequant.bin
set -euo pipefail
cd "$(dirname "$0")/.."
ref=$(bash bench/llama_ref.sh | tail -1)
L=$(dirname "$(dirname "$ref")")
out=build/ggml_dequant
mkdir -p "$out"
cc -O2 -Wall -Wextra -Werror -I"$L/ggml/include" bench/ggml_dequant.c -L"$ref" -lggml-base -lggml -lm \
  -Wl,-rpath,"$ref" -o "$out/ggml_dequant"
if [ "${1:-}" = --vectors ]; then
  "$out/ggml_dequant" vectors tests/kern/data/ggml_dequant.bin
  exit 0
fi
shape=${1:-small}
cmake --build build -j2 --target cairn test_ggml_dequant >/dev/null
v=../shared/testdata/vocab/ggml-vocab-llama-spm.gguf
[ -f "$out/$shape-f32.gguf" ] || ./build/cairn mkmodel --shape "$shape" --type f32 --vocab "$v" -o "$out/$shape-f32.gguf" >/dev/null
fail=0
check() {  # check NAME FILE
  "$out/ggml_dequant" file "$2" "$out/$1.bin" 2>/dev/null
  if r=$(CAIRN_GGML_VECTORS="$out/$1.bin" ./build/test_ggml_dequant 2>&1); then
    echo "same   $1: $(echo "$r" | head -1 | sed 's/^[^:]*: //')"
  else
    echo "DIFFER $1"; echo "$r" | head -5; fail=1
  fi
}
for t in Q2_K Q3_K IQ4_NL IQ4_XS; do
  "$ref/llama-quantize" "$out/$shape-f32.gguf" "$out/$shape-llama-$t.gguf" "$t" >/dev/null 2>&1
  check "llama-quantize-$t" "$out/$shape-llama-$t.gguf"
done
# MXFP4: llama.cpp's MXFP4_MOE mix quantizes only experts, so name the dense tensors
"$ref/llama-quantize" --tensor-type attn=mxfp4 --tensor-type ffn=mxfp4 "$out/$shape-f32.gguf" \
  "$out/$shape-llama-MXFP4.gguf" Q8_0 >/dev/null 2>&1
check llama-quantize-MXFP4 "$out/$shape-llama-MXFP4.gguf"
for t in q2_k q3_k iq4_nl iq4_xs mxfp4; do
  ./build/cairn mkmodel --shape "$shape" --type "$t" --vocab "$v" -o "$out/$shape-cairn-$t.gguf" >/dev/null
  check "cairn-mkmodel-$t" "$out/$shape-cairn-$t.gguf"
done
exit $fail
