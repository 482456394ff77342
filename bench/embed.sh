#!/usr/bin/env bash
# Embeddings of cairn against llama.cpp's llama-server on the same synthetic GGUF file
# (mkmodel's qwen3-embed-0.6b: Qwen3-Embedding-0.6B's shape, last-token pooling, EOS
# appended), both served over HTTP on 127.0.0.1 with the same threads and asked the same
# /v1/embeddings request of 32 texts (16 to 80 tokens each):
#   - cosine similarity of each text's vector from the two servers (min and mean over the
#     32 texts of every run; both L2-normalised), which must be >= 0.999 on every type;
#   - throughput, prompt tokens / wall time of the batch of 32, best of REPS runs each,
#     run against one server and then the other so both see the same machine load.
# llama-server runs with --embeddings (pooling as the file declares), 32 slots so it
# batches the 32 texts (256 positions each), a 2048-token batch and 512-token micro-batch
# (cairn's runner forwards up to 512 tokens at once); each server gets one untimed batch
# first.
#   usage: bench/embed.sh [-q "f32 f16 q8_0"] [-t THREADS] [-r REPS] [--shape NAME] [--port N]
#          (defaults: f32 f16 q8_0, 2 threads, 3 runs, qwen3-embed-0.6b, ports 18771 and 18772)
set -euo pipefail
cd "$(dirname "$0")/.."
types="f32 f16 q8_0" threads=2 reps=3 port=18771 shape=qwen3-embed-0.6b
while [ $# -gt 0 ]; do
  case $1 in
    -q|--types) types=$2; shift 2 ;;
    -t|--threads) threads=$2; shift 2 ;;
    -r|--reps) reps=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "embed.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
ref=${LLAMA_REF_BIN:-$HOME/.cache/llama-ref/llama.cpp/build/bin}
[ -x "$ref/llama-server" ] || ref=$(bash bench/llama_ref.sh | tail -1)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j2 --target cairn >/dev/null
cairn=./build/cairn
work=build/embed-bench
mkdir -p "$work"

# 32 texts, 16 to 80 tokens, from a fixed seed: request-0.json for the untimed first
# batch, request-R.json for run R. Each run asks new texts: llama-server keeps each slot's
# last prompt and would compute only its last token again for a repeated text.
for r in $(seq 0 "$reps"); do
  python3 - "$work/request-$r.json" "$r" <<'EOF'
import json, random, sys
words = ("the a river stone cairn model vector cluster memory machine light quiet north seven "
         "embedding search query answer paper garden window morning evening small large fast").split()
rng = random.Random(7 + 1000 * int(sys.argv[2]))
texts = [" ".join(rng.choice(words) for _ in range(rng.randint(14, 70))).capitalize() + "." for _ in range(32)]
json.dump({"input": texts, "encoding_format": "float"}, open(sys.argv[1], "w"))
EOF
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# wait_ready URL MODEL: until a one-text embedding succeeds (the first places the model).
wait_ready() {
  local t=0
  until curl -sf -m 300 "$1/v1/embeddings" -H 'content-type: application/json' \
      -d "{\"model\":\"$2\",\"input\":\"warm up\"}" >/dev/null 2>&1; do
    sleep 1; t=$((t + 1))
    [ $t -lt 600 ] || { echo "embed.sh: $1 did not answer" >&2; return 1; }
  done
}

# ask URL MODEL OUT RUN: POSTs request-RUN, writes the reply to OUT, prints seconds and tokens.
ask() {
  python3 - "$1" "$2" "$work/request-$4.json" "$3" <<'EOF'
import json, sys, time, urllib.request
url, model, req, out = sys.argv[1:]
body = json.load(open(req)); body["model"] = model
data = json.dumps(body).encode()
t0 = time.monotonic()
r = urllib.request.urlopen(urllib.request.Request(url + "/v1/embeddings", data,
                           {"content-type": "application/json"}), timeout=1800)
reply = r.read()
dt = time.monotonic() - t0
open(out, "wb").write(reply)
print(dt, json.loads(reply)["usage"]["prompt_tokens"])
EOF
}

echo "CPU: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; threads $threads; best of $reps"
printf '%-6s %10s %10s %14s %14s %7s\n' type cos_min cos_mean "cairn tok/s" "llama tok/s" ratio
for type in $types; do
  mdir=$work/models-$type
  name=$shape-$type
  mkdir -p "$mdir"
  [ -f "$mdir/$name.gguf" ] || $cairn mkmodel --shape "$shape" --type "$type" --seed 1 \
      --vocab ../shared/testdata/vocab/ggml-vocab-qwen2.gguf -o "$mdir/$name.gguf" >/dev/null
  rm -rf "$work/data"
  $cairn node --api-port "$port" --cluster-port 0 --models-dir "$mdir" --data-dir "$work/data" \
      --discovery off -q -t "$threads" >"$work/node-$type.log" 2>&1 &
  cpid=$!; pids+=("$cpid")
  "$ref/llama-server" -m "$mdir/$name.gguf" -a "$name" --embeddings --host 127.0.0.1 --port $((port + 1)) \
      -t "$threads" -tb "$threads" -np 32 -c $((32 * 256)) -b 2048 -ub 512 >"$work/llama-$type.log" 2>&1 &
  lpid=$!; pids+=("$lpid")
  wait_ready "http://127.0.0.1:$port" "$name"
  wait_ready "http://127.0.0.1:$((port + 1))" "$name"
  # one untimed batch each: llama-server's first batch of 32 slots takes seconds to set up
  ask "http://127.0.0.1:$port" "$name" /dev/null 0 >/dev/null
  ask "http://127.0.0.1:$((port + 1))" "$name" /dev/null 0 >/dev/null
  best_c=0 best_l=0 tokens=0
  for r in $(seq "$reps"); do
    read -r dt tokens < <(ask "http://127.0.0.1:$port" "$name" "$work/cairn-$type-$r.json" "$r")
    best_c=$(python3 -c "print(max($best_c, $tokens / $dt))")
    read -r dt tokens_l < <(ask "http://127.0.0.1:$((port + 1))" "$name" "$work/llama-$type-$r.json" "$r")
    best_l=$(python3 -c "print(max($best_l, $tokens_l / $dt))")
  done
  [ "$tokens" = "$tokens_l" ] || echo "embed.sh: $type: cairn counted $tokens prompt tokens, llama.cpp $tokens_l" >&2
  python3 - "$work" "$type" "$reps" "$best_c" "$best_l" <<'EOF'
import json, math, sys
work, typ, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cos = []
for r in range(1, reps + 1):
    a, b = (json.load(open(f"{work}/{s}-{typ}-{r}.json"))["data"] for s in ("cairn", "llama"))
    a = {d["index"]: d["embedding"] for d in a}; b = {d["index"]: d["embedding"] for d in b}
    for i in sorted(a):
        x, y = a[i], b[i]
        cos.append(sum(p * q for p, q in zip(x, y)) / math.sqrt(sum(p * p for p in x) * sum(q * q for q in y)))
c, l = float(sys.argv[4]), float(sys.argv[5])
print(f"{sys.argv[2]:<6} {min(cos):10.6f} {sum(cos)/len(cos):10.6f} {c:14.1f} {l:14.1f} {c/l:6.2f}x")
if min(cos) < 0.999:
    print(f"embed.sh: {sys.argv[2]}: cosine {min(cos):.6f} < 0.999", file=sys.stderr); sys.exit(1)
EOF
  stop "$cpid"; stop "$lpid"
done
