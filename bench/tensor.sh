#!/usr/bin/env bash
# Tensor parallelism (issue 22), measured on one machine: `llama-1b` (or `llama-8b`,
# --model 8b) Q4_0, single-stream decode through the OpenAI API (bench/serve_load.mjs: a
# 128-token prompt, GEN greedy tokens) of
#   - one node with one thread, pinned to one core (taskset -c CORE_A);
#   - two nodes with one thread each, pinned to different cores (CORE_A, CORE_B), serving
#     one instance placed with "sharding":"tensor" over both (each rank reads half of
#     every matrix and exchanges its halves over the data plane, sealed with a secret);
#   - the same two nodes over a link with each added one-way delay of --delays (the data
#     plane's delay hook CAIRN_DP_DELAY_US: every frame leaves that long after it was
#     queued; this machine's kernel has no netem);
#   - one node with two threads on both cores, for reference;
# with, for the tensor instance, rank 0's time in its own part and in the exchanges per
# step, the data-plane bytes per step (/metrics) and the exchanges (synchronisations) per
# step: 4 per layer and one for the logits. Every node listens on 127.0.0.1 only, with
# discovery off. The ratios are from one run; the machine's other load moves them (the
# load average is printed with them). And the cost of one exchange alone
# (bench/tensor_xchg.c: two processes on the two cores, sealed frames of one layer's
# sizes, no compute), waiting by blocking and by spinning. And each runner's resident
# memory (VmRSS, RssAnon): a tensor rank holds only its rows of every matrix.
#   usage: bench/tensor.sh [--model 1b|8b] [--gen N] [--port N] [--cores A,B] [--delays "US ..."]
set -euo pipefail
cd "$(dirname "$0")/.."
gen=64 port=18881 cores=0,1 model=1b delays="500 2000"
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --delays) delays=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "tensor.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $model in
  1b) name=llama-1b layers=16 ;;
  8b) name=llama-8b layers=32 ;;
  *) echo "tensor.sh: --model is 1b or 8b" >&2; exit 2 ;;
esac
xchg=$((4 * layers + 1))
command -v node >/dev/null || { echo "tensor.sh: node is required for the load generator" >&2; exit 1; }
command -v taskset >/dev/null || { echo "tensor.sh: taskset (util-linux) is required" >&2; exit 1; }
core_a=${cores%,*} core_b=${cores#*,}
bd=${CAIRN_BENCH_BUILD:-build-bench}
cmake -S . -B "$bd" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$bd" -j2 --target cairn bench_tensor_xchg >/dev/null
cairn=$PWD/$bd/cairn
work=$bd/tensor
mdir=$work/models
mkdir -p "$mdir"
vocab=../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf
[ -f "$mdir/$name.gguf" ] || $cairn mkmodel --shape $name --type q4_0 --vocab $vocab -o "$mdir/$name.gguf" >/dev/null
secret=$work/secret
echo "tensor-bench-secret" >"$secret"
chmod 600 "$secret"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# start_node NAME API_PORT CLUSTER_PORT THREADS CPUS [ARGS...]: a node in the background.
start_node() {
  local name=$1 api=$2 cl=$3 t=$4 cpus=$5
  shift 5
  rm -rf "$work/$name"
  mkdir -p "$work/$name"
  CAIRN_DP_DELAY_US=${delay_us:-0} HOME=$work/$name XDG_CACHE_HOME=$work/$name taskset -c "$cpus" "$cairn" node --api-host 127.0.0.1 \
      --api-port "$api" --bind 127.0.0.1 --cluster-port "$cl" --discovery off --models-dir "$mdir" \
      --data-dir "$work/$name/data" --cluster-secret-file "$secret" -t "$t" --parallel 8 "$@" \
      >"$work/$name.log" 2>&1 &
  pids+=($!)
}
stop_nodes() { cleanup; pids=(); }

wait_ready() {
  for _ in $(seq 600); do
    curl -sf -m 60 "$1/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\":\"$2\",\"prompt\":\"the\",\"max_tokens\":1,\"temperature\":0}" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "tensor.sh: $1 did not serve $2" >&2
  return 1
}

metric() { curl -s "$1/metrics" | awk -v k="$2" 'index($0, k "{") == 1 {s += $2} END {print s + 0}'; }

results=$work/results.txt idle=$work/idle.txt memf=$work/mem.txt
: >"$results"
: >"$idle"
: >"$memf"
# runner_mem LABEL: VmRSS and RssAnon (the repacked weights live there) of each node's
# runner, after a request: a tensor rank holds only its rows of every matrix.
runner_mem() {
  local p q line=""
  for p in "${pids[@]}"; do
    for q in $(pgrep -P "$p"); do
      line="$line $(awk '/^VmRSS|^RssAnon/ {printf "%s %.1f MiB ", $1, $2 / 1024}' /proc/$q/status)|"
    done
  done
  echo "$1: runners:$line" | tee -a "$memf"
}
# measure LABEL URL: single-stream decode tok/s; for a tensor instance its figures per step.
measure() {
  local label=$1 url=$2
  local s0 w0 c0 b0 s1 w1 c1 b1 one
  s0=$(metric "$url" cairn_pipeline_steps_total); w0=$(metric "$url" cairn_pipeline_wait_microseconds_total)
  c0=$(metric "$url" cairn_pipeline_rank0_compute_microseconds_total); b0=$(metric "$url" cairn_pipeline_bytes_total)
  one=$(node bench/serve_load.mjs streams --url "$url" --model $name --n 1 --gen "$gen" --timeout-s 900)
  # the runner's own clock: decode time of one more request (timings.predicted_ms)
  local prompt timed
  prompt=$(node bench/serve_load.mjs prompt --tokens 128 --salt 977)
  timed=$(node -e 'process.stdout.write(JSON.stringify({model: process.argv[3], prompt: process.argv[1],
      max_tokens: Number(process.argv[2]), temperature: 0, ignore_eos: true}))' "$prompt" "$gen" "$name" |
    curl -sf -m 900 "$url/v1/completions" -H 'content-type: application/json' -d @-)
  s1=$(metric "$url" cairn_pipeline_steps_total); w1=$(metric "$url" cairn_pipeline_wait_microseconds_total)
  c1=$(metric "$url" cairn_pipeline_rank0_compute_microseconds_total); b1=$(metric "$url" cairn_pipeline_bytes_total)
  node -e '
    const [label, one, timed, s0, w0, c0, b0, s1, w1, c1, b1, xchg] = process.argv.slice(1).map((v, i) => i < 3 ? v : Number(v));
    const a = JSON.parse(one), t = JSON.parse(timed).timings, steps = s1 - s0;
    const runner = (t.predicted_n / t.predicted_ms * 1000).toFixed(2);
    const per = steps > 0 ? `${((c1 - c0) / steps / 1000).toFixed(2)} ms own part, ` +
      `${((w1 - w0) / steps / 1000).toFixed(2)} ms in ${xchg} exchanges, ${((b1 - b0) / steps / 1024).toFixed(1)} KiB on the wire` : "-";
    console.log(`| ${label} | ${a.decode_tps} | ${a.e2e_tps} | ${runner} | ${per} |`);
  ' "$label" "$one" "$timed" "$s0" "$w0" "$c0" "$b0" "$s1" "$w1" "$c1" "$b1" "$xchg" | tee -a "$results"
}

a=http://127.0.0.1:$port
echo "== one node, 1 thread on core $core_a" >&2
start_node one "$port" $((port + 1)) 1 "$core_a"
wait_ready "$a" $name
measure "one node, 1 thread (core $core_a)" "$a"
runner_mem "one node"
stop_nodes

# idle_cpu: the CPU the nodes and their runners use over 5 s with no request (% of one
# core): an idle rank must block, not spin.
ticks() {
  local t=0 p
  for p in "${pids[@]}" $(for q in "${pids[@]}"; do pgrep -P "$q"; done); do
    [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat)))
  done
  echo $t
}
idle_cpu() {
  sleep 3
  local t0 t1
  t0=$(ticks); sleep 5; t1=$(ticks)
  echo "$1: idle CPU over 5 s: $(( (t1 - t0) * 100 / $(getconf CLK_TCK) / 5 ))% of one core" | tee -a "$idle"
}

# tensor_run: the two-node tensor instance, its links delayed by $delay_us (0: none).
tensor_run() {
  local what="two nodes x 1 thread, tensor (cores $core_a, $core_b)"
  [ "${delay_us:-0}" -gt 0 ] && what="$what, +${delay_us} us one-way delay"
  echo "== $what" >&2
  start_node a "$port" $((port + 1)) 1 "$core_a"
  sleep 1
  start_node b $((port + 2)) $((port + 3)) 1 "$core_b" --peer 127.0.0.1:$((port + 1))
  for _ in $(seq 120); do
    n=$(curl -s "$a/state" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{
      try { console.log(Object.keys(JSON.parse(s).nodes).length) } catch { console.log(0) }})') || n=0
    [ "$n" -ge 2 ] && break
    sleep 0.5
  done
  curl -sf -m 600 "$a/place_instance" -H 'content-type: application/json' \
      -d "{\"model_id\":\"$name\",\"sharding\":\"tensor\",\"min_nodes\":2}" >/dev/null
  wait_ready "$a" $name
  measure "$what" "$a"
  runner_mem "$what"
  idle_cpu "$what"
  stop_nodes
}
delay_us=0 tensor_run
for d in $delays; do delay_us=$d tensor_run; done

echo "== one node, 2 threads (cores $cores)" >&2
start_node two "$port" $((port + 1)) 2 "$cores"
wait_ready "$a" $name
measure "one node, 2 threads (cores $cores)" "$a"
stop_nodes

echo "== one exchange alone (bench_tensor_xchg, cores $cores)" >&2
xchg_out=$("$bd/bench_tensor_xchg" 4000 2000 "$cores")

echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| setup | 1 stream decode tok/s (client) | end to end tok/s | runner's decode tok/s | tensor rank 0 per step (128-token prefill and decode) |"
echo "|---|---:|---:|---:|---|"
cat "$results"
cat "$idle"
cat "$memf"
echo
echo "One sealed exchange alone, two processes on cores $cores (4/4/16/4 KiB parts each way, as one llama-1b layer):"
echo "$xchg_out"
