#!/usr/bin/env bash
# Long context, cairn against llama.cpp with flash attention, interleaved in one run (the
# machine is shared: compare ratios from the same run, not numbers across runs):
#   prefill of 512, 4096 (and 16384) tokens: tok/s of each, cairn / llama.cpp, and the time
#   per prompt token at each length over that at 512;
#   decode at depth D with F16 and Q8_0 KV caches: tok/s of each and cairn / llama.cpp;
#   the attention alone at depth 16384 (bench_attn_long: decode's K+V bytes per second
#   against the machine's read bandwidth, prefill's time per token at 16k over that at 512).
# usage: bench/longctx.sh [THREADS 2] [TYPE q4_0]
#   PP="512 4096 16384" (prompt lengths), DEPTH=4096 (decode depth), BASE=path/to/cairn
#   (another build measured in the same run, e.g. the commit before a change), TG_TYPES=""
#   (no decode), ATTN=0 (no bench_attn_long).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
type=${2:-q4_0}
pp=${PP:-512 4096 16384}
depth=${DEPTH:-4096}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target cairn bench_attn_long >/dev/null
ref=$(bash bench/llama_ref.sh | tail -1)
m=build/models/llama-1b-$type.gguf
mkdir -p build/models
[ -f "$m" ] || ./build/cairn mkmodel --shape llama-1b --type "$type" --ctx 32768 \
    --vocab ../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf -o "$m"
bins=(./build/cairn)
[ -n "${BASE:-}" ] && bins+=("$BASE")
echo "=== llama-1b $type, $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ==="

tok_s() { grep -oE '^(pp|tg)[0-9]+[^:]*: [0-9.]+' | awk '{print $NF}'; }
llama_ts() { grep -E '^\|' | tail -1 | awk -F'|' '{print $(NF-1)}' | awk '{print $1}'; }

declare -A first c
for p in $pp; do
  line="pp$p"
  for b in "${bins[@]}"; do
    t=$("$b" bench -m "$m" -p "$p" -n 0 -t "$threads" -r 1 --batch-curve 0 2>/dev/null | tok_s)
    line+="  $b: $t tok/s"
    [ -n "${first[$b]:-}" ] || first[$b]=$t
    line+=" (per token x$(python3 -c "print(f'{${first[$b]}/$t:.2f}')") of pp${pp%% *})"
    [ -n "${c[$p]:-}" ] || c[$p]=$t
  done
  l=$("$ref/llama-bench" -m "$m" -fa 1 -p "$p" -n 0 -t "$threads" -r 1 -o md 2>/dev/null | llama_ts)
  line+="  llama.cpp -fa 1: $l tok/s; cairn/llama.cpp $(python3 -c "print(f'{${c[$p]}/$l:.2f}')")"
  echo "$line"
done
for ct in ${TG_TYPES-f16 q8_0}; do
  line="tg32 @ d$depth, KV $ct"
  for b in "${bins[@]}"; do
    t=$("$b" bench -m "$m" -p 0 -n 32 -d "$depth" -ctk $ct -ctv $ct -t "$threads" -r 1 --batch-curve 0 2>/dev/null \
        | grep -E '^tg' | tok_s)
    line+="  $b: $t tok/s"
    [ -n "${c[$ct]:-}" ] || c[$ct]=$t
  done
  l=$("$ref/llama-bench" -m "$m" -fa 1 -ctk $ct -ctv $ct -p 0 -n 32 -d "$depth" -t "$threads" -r 1 -o md 2>/dev/null \
      | llama_ts)
  line+="  llama.cpp -fa 1: $l tok/s; cairn/llama.cpp $(python3 -c "print(f'{${c[$ct]}/$l:.2f}')")"
  echo "$line"
done
for ct in $([ "${ATTN:-1}" = 1 ] && echo f16 q8_0); do
  ./build/bench_attn_long 16384 "$threads" $ct
done
