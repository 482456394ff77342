#!/usr/bin/env bash
# Tensor parallelism (issue 22), measured on one machine: `llama-1b` (or `llama-8b`,
# --model 8b) Q4_0, single-stream decode through the OpenAI API (bench/serve_load.mjs: a
# 128-token prompt, GEN greedy tokens) of three setups:
#   A. one node with one thread, pinned to one core (taskset -c CORE_A);
#   B. two nodes with one thread each, pinned to different cores (CORE_A, CORE_B), serving
#      one instance placed with "sharding":"tensor" over both (each rank reads half of
#      every matrix and exchanges its halves over the data plane, sealed with a secret);
#   C. one node with two threads on both cores, for reference.
# The three run side by side (idle nodes block: they take no CPU; their memory adds up:
# about 2.3 GiB for llama-1b, 14 GiB for llama-8b) and are measured in
# rounds, A B C, A B C, ... (--rounds N), so that a swing of the machine's memory
# bandwidth or load hits all three alike; each round prints its ratios B/A (target >=
# 1.7x) and B/C (target >= 0.9x), and the medians over the rounds close the run. Then,
# once each, the two nodes over a link with each added one-way delay of --delays (the
# data plane's delay hook CAIRN_DP_DELAY_US: every frame leaves that long after it was
# queued; this machine's kernel has no netem).
# For the tensor instance: rank 0's time in its own part and in the exchanges per
# step, the data-plane bytes per step (/metrics) and the exchanges (synchronisations) per
# step: 4 per layer and one for the logits; and each rank's own account of its steps
# (each runner's "tensor rank R: N steps ..." lines, CAIRN_TENSOR_LOG: its time waiting for the other's
# parts, at the step's first exchange and at the logits, and between steps). Every node
# listens on 127.0.0.1 only, with discovery off. The load average is printed with the
# ratios. And the cost of one exchange alone (bench/tensor_xchg.c: two processes on the
# two cores, sealed frames of one layer's sizes, no compute), waiting by blocking and by
# spinning. And each runner's resident memory (VmRSS, RssAnon): a tensor rank holds only
# its rows of every matrix.
#   usage: bench/tensor.sh [--model 1b|8b] [--gen N] [--port N] [--cores A,B] [--delays "US ..."]
#                          [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
gen=64 port=18881 cores=0,1 model=1b delays="500 2000" rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --delays) delays=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "tensor.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $model in
  1b) name=llama-1b layers=16 ;;
  8b) name=llama-8b layers=32 ;;
  *) echo "tensor.sh: --model is 1b or 8b" >&2; exit 2 ;;
esac
case $rounds in ''|*[!0-9]*|0) echo "tensor.sh: --rounds is a count >= 1" >&2; exit 2 ;; esac
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

# start_node NAME API_PORT CLUSTER_PORT THREADS CPUS [ARGS...]: a node in the background
# (its pid in last_pid).
start_node() {
  local name=$1 api=$2 cl=$3 t=$4 cpus=$5
  shift 5
  rm -rf "$work/$name"
  mkdir -p "$work/$name"
  CAIRN_TENSOR_LOG=$work/$name/tensor.log CAIRN_DP_DELAY_US=${delay_us:-0} HOME=$work/$name XDG_CACHE_HOME=$work/$name taskset -c "$cpus" "$cairn" node --api-host 127.0.0.1 \
      --api-port "$api" --bind 127.0.0.1 --cluster-port "$cl" --discovery off --models-dir "$mdir" \
      --data-dir "$work/$name/data" --cluster-secret-file "$secret" -t "$t" --parallel 8 "$@" \
      >"$work/$name.log" 2>&1 &
  last_pid=$!
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

results=$work/results.txt idle=$work/idle.txt memf=$work/mem.txt ratios=$work/ratios.txt last=$work/last.txt
ranks=$work/ranks.txt
: >"$ranks"
: >"$results"
: >"$idle"
: >"$memf"
: >"$ratios"
# runner_mem LABEL PID...: VmRSS and RssAnon (the repacked weights live there) of those
# nodes' runners, after a request: a tensor rank holds only its rows of every matrix.
runner_mem() {
  local label=$1 p q line=""
  shift
  for p in "$@"; do
    for q in $(pgrep -P "$p"); do
      line="$line $(awk '/^VmRSS|^RssAnon/ {printf "%s %.1f MiB ", $1, $2 / 1024}' /proc/$q/status)|"
    done
  done
  echo "$label: runners:$line" | tee -a "$memf"
}
# measure LABEL URL SALT: single-stream decode tok/s (the client's and the runner's, also
# left in $last); for a tensor instance its figures per step.
measure() {
  local label=$1 url=$2 salt=$3
  local s0 w0 c0 b0 s1 w1 c1 b1 one
  s0=$(metric "$url" cairn_pipeline_steps_total); w0=$(metric "$url" cairn_pipeline_wait_microseconds_total)
  c0=$(metric "$url" cairn_pipeline_rank0_compute_microseconds_total); b0=$(metric "$url" cairn_pipeline_bytes_total)
  one=$(node bench/serve_load.mjs streams --url "$url" --model $name --n 1 --gen "$gen" --timeout-s 900)
  # the runner's own clock: decode time of one more request (timings.predicted_ms)
  local prompt timed
  prompt=$(node bench/serve_load.mjs prompt --tokens 128 --salt "$salt")
  timed=$(node -e 'process.stdout.write(JSON.stringify({model: process.argv[3], prompt: process.argv[1],
      max_tokens: Number(process.argv[2]), temperature: 0, ignore_eos: true}))' "$prompt" "$gen" "$name" |
    curl -sf -m 900 "$url/v1/completions" -H 'content-type: application/json' -d @-)
  s1=$(metric "$url" cairn_pipeline_steps_total); w1=$(metric "$url" cairn_pipeline_wait_microseconds_total)
  c1=$(metric "$url" cairn_pipeline_rank0_compute_microseconds_total); b1=$(metric "$url" cairn_pipeline_bytes_total)
  node -e '
    const fs = require("fs");
    const [label, one, timed, s0, w0, c0, b0, s1, w1, c1, b1, xchg, last] = process.argv.slice(1).map((v, i) => i < 3 || i == 12 ? v : Number(v));
    const a = JSON.parse(one), t = JSON.parse(timed).timings, steps = s1 - s0;
    const runner = (t.predicted_n / t.predicted_ms * 1000).toFixed(2);
    const per = steps > 0 ? `${((c1 - c0) / steps / 1000).toFixed(2)} ms own part, ` +
      `${((w1 - w0) / steps / 1000).toFixed(2)} ms in ${xchg} exchanges, ${((b1 - b0) / steps / 1024).toFixed(1)} KiB on the wire` : "-";
    console.log(`| ${label} | ${a.decode_tps} | ${a.e2e_tps} | ${runner} | ${per} |`);
    fs.writeFileSync(last, `${a.decode_tps} ${runner}\n`);
  ' "$label" "$one" "$timed" "$s0" "$w0" "$c0" "$b0" "$s1" "$w1" "$c1" "$b1" "$xchg" "$last" | tee -a "$results"
}

# ticks PID...: CPU ticks of those nodes and their runners so far.
ticks() {
  local t=0 p
  for p in "$@" $(for q in "$@"; do pgrep -P "$q"; done); do
    [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat)))
  done
  echo $t
}
# idle_cpu LABEL PID...: the CPU those nodes and their runners use over 5 s with no
# request (% of one core): an idle rank must block, not spin.
idle_cpu() {
  local label=$1
  shift
  sleep 3
  local t0 t1
  t0=$(ticks "$@"); sleep 5; t1=$(ticks "$@")
  echo "$label: idle CPU over 5 s: $(( (t1 - t0) * 100 / $(getconf CLK_TCK) / 5 ))% of one core" | tee -a "$idle"
}

# tensor_up API_PORT: the two-node tensor instance on API_PORT..API_PORT+3 (rank 0's API
# on API_PORT), its links delayed by $delay_us (0: none); the nodes' pids in tensor_pids.
tensor_up() {
  local p=$1 n u=http://127.0.0.1:$1
  start_node a "$p" $((p + 1)) 1 "$core_a"
  tensor_pids=($last_pid)
  sleep 1
  start_node b $((p + 2)) $((p + 3)) 1 "$core_b" --peer 127.0.0.1:$((p + 1))
  tensor_pids+=($last_pid)
  for _ in $(seq 120); do
    n=$(curl -s "$u/state" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{
      try { console.log(Object.keys(JSON.parse(s).nodes).length) } catch { console.log(0) }})') || n=0
    [ "$n" -ge 2 ] && break
    sleep 0.5
  done
  curl -sf -m 600 "$u/place_instance" -H 'content-type: application/json' \
      -d "{\"model_id\":\"$name\",\"sharding\":\"tensor\",\"min_nodes\":2}" >/dev/null
  wait_ready "$u" $name
}

# The three setups side by side: A on port, B on port+2..port+5, C on port+6.
url_a=http://127.0.0.1:$port url_b=http://127.0.0.1:$((port + 2)) url_c=http://127.0.0.1:$((port + 6))
label_a="one node, 1 thread (core $core_a)"
label_b="two nodes x 1 thread, tensor (cores $core_a, $core_b)"
label_c="one node, 2 threads (cores $cores)"
echo "== starting: $label_a; $label_b; $label_c" >&2
start_node one "$port" $((port + 1)) 1 "$core_a"
pid_a=$last_pid
start_node two $((port + 6)) $((port + 7)) 2 "$cores"
pid_c=$last_pid
delay_us=0 tensor_up $((port + 2))
wait_ready "$url_a" $name
wait_ready "$url_c" $name

for r in $(seq "$rounds"); do
  echo "== round $r of $rounds (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  measure "$label_a, round $r" "$url_a" $((977 + 3 * r))
  read -r ca ra <"$last"
  la=$(wc -l <"$work/a/tensor.log" 2>/dev/null || echo 0) lb=$(wc -l <"$work/b/tensor.log" 2>/dev/null || echo 0)
  measure "$label_b, round $r" "$url_b" $((978 + 3 * r))
  read -r cb rb <"$last"
  sleep 0.5 # each rank writes its line once its steps pause (50 ms)
  { tail -n +$((la + 1)) "$work/a/tensor.log" 2>/dev/null; tail -n +$((lb + 1)) "$work/b/tensor.log" 2>/dev/null; } |
    sed "s/^/round $r: /" >>"$ranks"
  measure "$label_c, round $r" "$url_c" $((979 + 3 * r))
  read -r cc rc <"$last"
  echo "$r $ca $cb $cc $ra $rb $rc $(cut -d' ' -f1 /proc/loadavg)" >>"$ratios"
done
runner_mem "$label_a" "$pid_a"
runner_mem "$label_b" "${tensor_pids[@]}"
runner_mem "$label_c" "$pid_c"
idle_cpu "$label_b" "${tensor_pids[@]}"
stop_nodes

for d in $delays; do
  what="$label_b, +${d} us one-way delay"
  echo "== $what" >&2
  delay_us=$d tensor_up "$port"
  measure "$what" "http://127.0.0.1:$port" $((990 + d))
  idle_cpu "$what" "${tensor_pids[@]}"
  stop_nodes
done

echo "== one exchange alone (bench_tensor_xchg, cores $cores)" >&2
xchg_out=$("$bd/bench_tensor_xchg" 4000 2000 "$cores")

echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| setup | 1 stream decode tok/s (client) | end to end tok/s | runner's decode tok/s | tensor rank 0 per step (128-token prefill and decode) |"
echo "|---|---:|---:|---:|---|"
cat "$results"
echo
echo "Rounds (A $label_a, B $label_b, C $label_c; client's decode tok/s, the runner's clock in brackets):"
echo "| round | load (1 min) | A | B | C | B/A (target >= 1.7) | B/C (target >= 0.9) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
node -e '
  const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(l => l.split(" ").map(Number));
  const f = v => v.toFixed(2), med = v => { const s = [...v].sort((x, y) => x - y), n = s.length;
    return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2; };
  for (const [r, ca, cb, cc, ra, rb, rc, load] of rows)
    console.log(`| ${r} | ${load} | ${f(ca)} (${f(ra)}) | ${f(cb)} (${f(rb)}) | ${f(cc)} (${f(rc)}) | ` +
      `${f(cb / ca)}x (${f(rb / ra)}x) | ${f(cb / cc)}x (${f(rb / rc)}x) |`);
  const col = i => rows.map(x => x[i]);
  const ba = rows.map(x => x[2] / x[1]), bc = rows.map(x => x[2] / x[3]);
  const rba = rows.map(x => x[5] / x[4]), rbc = rows.map(x => x[5] / x[6]);
  console.log(`| median | ${f(med(col(7)))} | ${f(med(col(1)))} (${f(med(col(4)))}) | ${f(med(col(2)))} (${f(med(col(5)))}) | ` +
    `${f(med(col(3)))} (${f(med(col(6)))}) | ${f(med(ba))}x (${f(med(rba))}x) | ${f(med(bc))}x (${f(med(rbc))}x) |`);
' "$ratios"
echo
if [ -s "$ranks" ]; then
  echo "Each rank's account of the tensor instance's steps in each round (CAIRN_TENSOR_LOG; one line per request):"
  cat "$ranks"
  echo
fi
cat "$idle"
cat "$memf"
echo
echo "One sealed exchange alone, two processes on cores $cores (4/4/16/4 KiB parts each way, as one llama-1b layer):"
echo "$xchg_out"
