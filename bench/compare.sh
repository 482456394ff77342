#!/usr/bin/env bash
# Side-by-side speed of cairn and llama.cpp on the same GGUF files, same machine, same
# threads: decode (tg), prefill (pp), the decode roofline, and the batch-cost curve.
# llama.cpp is built outside the project by ../shared/tools/llama-ref.sh (never committed).
#   usage: bench/compare.sh [THREADS] [TYPES...]     (default: 2 q8_0 q4_0 q4_k_m)
# SHAPE=NAME measures another mkmodel shape than llama-1b (gemma3 and phi3 shapes take the
# llama-spm vocabulary, the others llama-bpe).
# LONG=1 adds the growth with context (first type only): prefill of 512, 4096, 16384 and
# 32768 tokens, decode at depth 16384 with F16 and Q8_0 KV caches, against llama.cpp
# with flash attention (-fa 1) on the same file and threads. It takes a long while.
# PAIRS=N instead measures decode only, cairn's run and llama.cpp's alternated N times per
# type within seconds (-n ${PAIR_TOKENS:-64}), because a shared host's read bandwidth can
# swing by half from one minute to the next: each pair prints the ratio, cairn's % of
# the roofline and the probe beside it, and the type's line ends with the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}; shift || true
types=("$@"); [ ${#types[@]} -gt 0 ] || types=(q8_0 q4_0 q4_k_m)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j"$(nproc)" --target cairn >/dev/null
ref=$(bash bench/llama_ref.sh | tail -1)
mkdir -p build/models
shape=${SHAPE:-llama-1b}
case $shape in gemma3*|phi3*) vocab=llama-spm ;; *) vocab=llama-bpe ;; esac
model_of() { # the type's file, made by mkmodel the first time
  local m=build/models/$shape-$1.gguf
  [ -f "$m" ] || ./build/cairn mkmodel --shape "$shape" --type "$1" \
      --vocab ../shared/testdata/vocab/ggml-vocab-$vocab.gguf -o "$m" >/dev/null
  echo "$m"
}
if [ "${PAIRS:-0}" -gt 0 ]; then
  n=${PAIR_TOKENS:-64}
  tmp=$(mktemp); trap 'rm -f "$tmp"' EXIT
  for t in "${types[@]}"; do
    m=$(model_of "$t")
    echo "=== $shape $t, $threads threads: decode in $PAIRS alternated pairs (-n $n) ==="
    for ((i = 1; i <= PAIRS; i++)); do
      ours=$(./build/cairn bench -m "$m" -p 0 -n "$n" -t "$threads" -r 1 --batch-curve 0 | grep -E '^tg')
      theirs=$("$ref/llama-bench" -m "$m" -p 0 -n "$n" -t "$threads" -r 1 -o md 2>/dev/null | grep -E "\| *tg$n" || true)
      echo "$ours" | awk -v theirs="$theirs" -v i="$i" -v load="$(cut -d' ' -f1 /proc/loadavg)" '{
        split(theirs, f, "|"); split(f[8], r, " "); ref = r[1] + 0
        for (k = 1; k <= NF; k++) {
          if ($k == "tok/s" && !tps) tps = $(k - 1)
          if ($k == "DRAM" && !probe) probe = $(k + 1)
          if ($k == "of" && $(k + 1) == "roofline") pct = $(k - 1)
        }
        printf "pair %d: cairn %.2f, llama.cpp %.2f tok/s: %.2fx; %s of the roofline at a %s GB/s probe; load %s\n",
               i, tps, ref, (ref > 0 ? tps / ref : 0), pct, probe, load
      }'
    done | tee "$tmp"
    median() { sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    echo "median of $PAIRS pairs: $(awk '{ print $8 + 0 }' "$tmp" | median)x llama.cpp," \
         "$(awk '{ print $9 + 0 }' "$tmp" | median)% of the roofline"
  done
  exit 0
fi
for t in "${types[@]}"; do
  m=$(model_of "$t")
  echo "=== $shape $t, $threads threads ==="
  ./build/cairn bench -m "$m" -p 512 -n 128 -t "$threads" -r 3 --batch-curve 8
  "$ref/llama-bench" -m "$m" -p 512 -n 128 -t "$threads" -r 3 -o md 2>/dev/null | grep -E '^\|' || true
  # llama.cpp's batched decode: B sequences, one token each per step.
  "$ref/llama-batched-bench" -m "$m" -c 4096 -b 512 -ub 512 -npp 128 -ntg 32 -npl 1,2,4,8 -t "$threads" 2>/dev/null \
      | grep -E '^\|' || true
done
if [ "${LONG:-0}" = 1 ]; then
  m=$(model_of "${types[0]}")
  echo "=== $shape ${types[0]}, $threads threads: growth with context ==="
  for p in 512 4096 16384 32768; do
    ./build/cairn bench -m "$m" -p "$p" -n 0 -t "$threads" -r 1 --batch-curve 0 | grep -E '^pp'
  done
  for ct in f16 q8_0; do
    ./build/cairn bench -m "$m" -p 0 -n 32 -d 16384 -ctk $ct -ctv $ct -t "$threads" -r 1 --batch-curve 0 | grep -E '^tg'
  done
  "$ref/llama-bench" -m "$m" -fa 1 -p 512,4096,16384,32768 -n 0 -t "$threads" -r 1 -o md 2>/dev/null | grep -E '^\|' || true
  for ct in f16 q8_0; do
    "$ref/llama-bench" -m "$m" -fa 1 -ctk $ct -ctv $ct -p 0 -n 32 -d 16384 -t "$threads" -r 1 -o md 2>/dev/null \
      | grep -E '^\|' || true
  done
fi
