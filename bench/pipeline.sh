#!/usr/bin/env bash
# A model across two nodes (issue 7), measured on one machine: `llama-1b` Q4_0, two
# `cairn node` processes of one thread each serving a pipelined instance (min_nodes 2),
# against one node of two threads, through the OpenAI API (bench/serve_load.mjs):
#   - single-stream decode, and aggregate decode at 8 streams (128-token prompts, 128
#     generated tokens, greedy), with rank 0's time in its own layers and waiting for
#     the ring per step (/metrics);
#   - the same over an emulated slower link: each data-plane frame held DELAY_US (1000,
#     so 2 ms of round trip) before it leaves (CAIRN_DP_DELAY_US; this machine's kernel
#     has no tc netem, so the delay is added in the sender, not the kernel);
#   - single-stream decode with a 2-layer draft (num_draft_tokens 4) on a target whose
#     layers from 2 on are scaled (acceptance about 0.8), with and without the delay.
# Every node listens on 127.0.0.1 only, with discovery off.
#   usage: bench/pipeline.sh [--delay-us N] [--gen N] [--port N]
set -euo pipefail
cd "$(dirname "$0")/.."
delay=1000 gen=128 port=18781
while [ $# -gt 0 ]; do
  case $1 in
    --delay-us) delay=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "pipeline.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v node >/dev/null || { echo "pipeline.sh: node is required for the load generator" >&2; exit 1; }
bd=build-bench
cmake -S . -B $bd -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build $bd -j2 --target cairn >/dev/null
cairn=$PWD/$bd/cairn
work=$bd/pipeline
mdir=$work/models
mkdir -p "$mdir"
vocab=../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf
[ -f "$mdir/llama-1b.gguf" ] || $cairn mkmodel --shape llama-1b --type q4_0 --vocab $vocab -o "$mdir/llama-1b.gguf" >/dev/null
[ -f "$mdir/spec-target.gguf" ] || $cairn mkmodel --shape llama-1b --type q4_0 --vocab $vocab --scale-from 2 \
    --scale 0.04 -o "$mdir/spec-target.gguf" >/dev/null
[ -f "$mdir/spec-draft.gguf" ] || $cairn mkmodel --draft-of "$mdir/spec-target.gguf" --layers 2 \
    -o "$mdir/spec-draft.gguf" >/dev/null

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# start_node NAME API_PORT CLUSTER_PORT THREADS [ARGS...]: a node in the background.
start_node() {
  local name=$1 api=$2 cl=$3 t=$4
  shift 4
  rm -rf "$work/$name"
  mkdir -p "$work/$name"
  HOME=$work/$name XDG_CACHE_HOME=$work/$name "$cairn" node --api-host 127.0.0.1 --api-port "$api" \
      --bind 127.0.0.1 --cluster-port "$cl" --discovery off --models-dir "$mdir" --data-dir "$work/$name/data" \
      -t "$t" --parallel 8 "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
}
stop_nodes() { cleanup; pids=(); }

# wait_ready URL: until the instance answers a one-token completion.
wait_ready() {
  for _ in $(seq 600); do
    curl -sf -m 60 "$1/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$2\",\"prompt\":\"the\",\"max_tokens\":1,\"temperature\":0}" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "pipeline.sh: $1 did not serve $2" >&2
  return 1
}

# place URL BODY: places an instance, waits until it serves.
place() {
  curl -sf -m 600 "$1/place_instance" -H 'content-type: application/json' -d "$2" >/dev/null
  wait_ready "$1" "$(sed 's/.*"model_id":"\([^"]*\)".*/\1/' <<<"$2")"
}

metric() { curl -s "$1/metrics" | awk -v k="$2" 'index($0, k "{") == 1 {s += $2} END {print s + 0}'; }

# measure LABEL URL MODEL: single-stream and 8-stream decode, the ring's figures per step.
results=$work/results.txt
: >"$results"
measure() {
  local label=$1 url=$2 model=$3
  local s0 w0 c0
  s0=$(metric "$url" cairn_pipeline_steps_total); w0=$(metric "$url" cairn_pipeline_wait_microseconds_total)
  c0=$(metric "$url" cairn_pipeline_rank0_compute_microseconds_total)
  local one eight
  one=$(node bench/serve_load.mjs streams --url "$url" --model "$model" --n 1 --gen "$gen" --timeout-s 600)
  local s1 w1 c1
  s1=$(metric "$url" cairn_pipeline_steps_total); w1=$(metric "$url" cairn_pipeline_wait_microseconds_total)
  c1=$(metric "$url" cairn_pipeline_rank0_compute_microseconds_total)
  eight=$(node bench/serve_load.mjs streams --url "$url" --model "$model" --n 8 --gen "$gen" --timeout-s 600)
  node -e '
    const [label, one, eight, s0, w0, c0, s1, w1, c1] = process.argv.slice(1);
    const a = JSON.parse(one), b = JSON.parse(eight), steps = s1 - s0;
    const per = steps > 0 ? `rank 0 per step: ${((c1 - c0) / steps / 1000).toFixed(2)} ms own layers, ` +
      `${((w1 - w0) / steps / 1000).toFixed(2)} ms waiting for the ring` : "one node";
    console.log(`| ${label} | ${a.decode_tps} | ${b.decode_tps} | ${per} |`);
  ' "$label" "$one" "$eight" "$s0" "$w0" "$c0" "$s1" "$w1" "$c1" | tee -a "$results"
}

# draft LABEL URL: single-stream decode of the spec target with its draft placed.
draft_row() {
  local label=$1 url=$2 extra=$3
  place "$url" "{\"model_id\":\"spec-target\",$extra}"
  local plain with
  plain=$(node bench/serve_load.mjs streams --url "$url" --model spec-target --n 1 --gen "$gen" --timeout-s 600)
  local id
  id=$(curl -s "$url/state" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);
    console.log(Object.keys(j.instances).find(i=>j.instances[i].model_id==="spec-target"))})')
  curl -sf -XPUT "$url/instance/$id/draft_model" -H 'content-type: application/json' \
      -d '{"draft_model":"spec-draft","num_draft_tokens":4}' >/dev/null
  sleep 3
  with=$(node bench/serve_load.mjs streams --url "$url" --model spec-target --n 1 --gen "$gen" --timeout-s 600)
  local acc
  acc=$(curl -s "$url/metrics" | awk '/^cairn_accepted_draft_tokens_total /{a=$2} /^cairn_draft_tokens_total /{d=$2} END {if (d) printf "%.2f", a/d}')
  node -e '
    const [label, plain, withd, acc] = process.argv.slice(1);
    const p = JSON.parse(plain).decode_tps, w = JSON.parse(withd).decode_tps;
    console.log(`| ${label} | ${p} | ${w} | x${(w / p).toFixed(2)} | ${acc} |`);
  ' "$label" "$plain" "$with" "$acc" | tee -a "$results"
  curl -sf -XDELETE "$url/instance/$id" >/dev/null
}

a=http://127.0.0.1:$port
echo "== one node, 2 threads" >&2
start_node one "$port" $((port + 1)) 2
wait_ready "$a" llama-1b
measure "one node, 2 threads" "$a" llama-1b
draft_row "one node, 2 threads" "$a" '"min_nodes":1'
stop_nodes

for d in 0 "$delay"; do
  echo "== two nodes of 1 thread, link delay ${d} us each way" >&2
  export CAIRN_DP_DELAY_US=$d
  start_node a "$port" $((port + 1)) 1
  sleep 1
  start_node b $((port + 2)) $((port + 3)) 1 --peer 127.0.0.1:$((port + 1))
  for _ in $(seq 120); do
    n=$(curl -s "$a/state" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{
      try { console.log(Object.keys(JSON.parse(s).nodes).length) } catch { console.log(0) }})')
    [ "$n" -ge 2 ] && break
    sleep 0.5
  done
  place "$a" '{"model_id":"llama-1b","sharding":"pipeline","min_nodes":2}'
  label="two nodes x 1 thread, +$((2 * d / 1000)) ms RTT"
  measure "$label" "$a" llama-1b
  draft_row "$label" "$a" '"sharding":"pipeline","min_nodes":2'
  stop_nodes
  unset CAIRN_DP_DELAY_US
done

echo
echo "| setup | 1 stream tok/s | 8 streams tok/s | ring |"
echo "|---|---:|---:|---|"
grep -v ' x[0-9.]* |' "$results" | grep -v '^$' || true
echo
echo "| setup (spec target, 2-layer draft, k = 4) | plain tok/s | with draft tok/s | speed-up | accepted / drafted |"
echo "|---|---:|---:|---:|---:|"
grep ' x[0-9.]* |' "$results" || true
