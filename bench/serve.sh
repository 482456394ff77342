#!/usr/bin/env bash
# Serving speed of `cairn node` against llama-server on the same GGUF file, same threads,
# everything on 127.0.0.1, through the OpenAI /v1/completions API (streamed):
#   1. aggregate decode tok/s at 1, 2, 4, 8 and 16 concurrent streams (128-token prompt,
#      128 generated with ignore_eos), and the ratio to one stream;
#   2. time to first token of a 128-token prompt against the engine's prefill of it
#      (`cairn bench -p 128 -n 0`, `llama-bench -p 128 -n 0`, run just before);
#   3. against the engine alone (`cairn bench --batch-curve 8 -p 128`, run just before and
#      just after): the 8 streams' decode rate over the engine's step of B = 8, and 8
#      clients sending 128-token requests back to back (prompts arriving while the
#      others decode), their generated tok/s over the engine's B = 8 rate (the arriving
#      prompts' prefill counted as time, not tokens) and the engine's own time for the
#      same work (those prompts at its prefill rate plus the tokens at its B = 8 rate)
#      over theirs; the engine's B = 8 before and after each run apart (flagged where they
#      differ by more than 15%: a neighbour's load moved, and ratios to their mean say
#      little), and the served full step's median against each one's step of 8 at depth 192;
#      How the runner's steps filled during the 8 streams (their CAIRN_STEP_LOG): steps
#      by sequences decoding, full steps, the time the batch took to fill, the tail; and
#      the serving account of the 8 streams end to end: the engine's time for the same
#      steps (their prompt tokens at its pp128 rate, each step of B decoding at its
#      --batch-curve 8 --batch-depth 192 step of B) over the wall time (serving
#      efficiency), the ideal schedule's (the prompts, then every token in steps of 8)
#      over the wall, and the wall split into outside the runner, before its first step,
#      between steps, and the fill, full and tail steps (serve_load.mjs accountOf).
#   4. while a 2000-token prompt is prefilled: the inter-token gaps of 4 running streams
#      (p99 against their median) and the long prompt's TTFT against its TTFT alone.
# Both servers stay up side by side (idle, they take no CPU) and each measure runs
# against one and then the other, REPS times, so both see the same machine load; the
# table shows each one's best run (highest tok/s, lowest TTFT, lowest p99 ratio) and the
# load average. On a shared machine other work distorts every figure: llama.cpp's
# spinning thread barrier collapses when its threads lose their cores, cairn's pool
# yields. --ref-wait passive runs llama.cpp with OMP_WAIT_POLICY=passive (its OpenMP
# threads sleep at a barrier instead of spinning): 2-3x faster here while other work
# runs, 15-25% slower on an idle machine. The load generator is bench/serve_load.mjs.
# llama.cpp comes from ../shared/tools/llama-ref.sh (built outside the project); without
# its llama-server the comparison is skipped unless --build-ref builds it (slow).
#   usage: bench/serve.sh [-q TYPE] [-t THREADS] [-r REPS] [--port N] [--build-ref] [--no-ref]
#                         [--ref-wait passive|default] [--perf] [--cairn PATH] [--quick]
#          (--quick: only part 3 against the engine, cairn alone: the engine's B = 8, the 8
#          streams with their step log, the 8 clients back to back, the engine again; about
#          a minute a rep, for alternated old/new pairs with --cairn)
#          (--cairn: serve with that cairn binary, e.g. an older build for a before/after
#          pair; the engine's figures still come from this tree's build)
#          (defaults: q4_0, 2 threads, 2 runs, ports 18671 and 18672)
set -euo pipefail
caller=$PWD # --cairn PATH is the caller's, not the repo root's
cd "$(dirname "$0")/.."
type=q4_0 threads=2 reps=2 port=18671 build_ref=0 no_ref=0 perf=0 ref_wait=default serve_bin= quick=0
while [ $# -gt 0 ]; do
  case $1 in
    -q|--type) type=$2; shift 2 ;;
    -t|--threads) threads=$2; shift 2 ;;
    -r|--reps) reps=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --build-ref) build_ref=1; shift ;;
    --no-ref) no_ref=1; shift ;;
    --perf) perf=1; shift ;;
    --quick) quick=1; no_ref=1; shift ;;
    --ref-wait) ref_wait=$2; shift 2 ;;
    --cairn) serve_bin=$(cd "$caller" && realpath -m -- "$2"); shift 2 ;;
    -h|--help) sed -n '2,44p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$threads" "$reps" "$port"; do
  [[ $v =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || { echo "serve.sh: '$v' is not a positive integer" >&2; exit 2; }
done
case $ref_wait in
  passive) refenv=(env OMP_WAIT_POLICY=PASSIVE) ;;
  default) refenv=(env) ;;
  *) echo "serve.sh: --ref-wait passive or default, not '$ref_wait'" >&2; exit 2 ;;
esac
command -v node >/dev/null || { echo "serve.sh: node is required for the load generator" >&2; exit 1; }
nice=""
nice -n -20 true 2>/dev/null && nice="nice -n -20"

bd=build-bench
cmake -S . -B $bd -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build $bd -j2 --target cairn >/dev/null
cairn=$bd/cairn
serve_bin=${serve_bin:-$cairn}
[ -x "$serve_bin" ] || { echo "serve.sh: --cairn $serve_bin is not an executable" >&2; exit 2; }
mdir=$bd/serve-models
name=llama-1b-$type
model=$mdir/$name.gguf
mkdir -p "$mdir"
[ -f "$model" ] || $cairn mkmodel --shape llama-1b --type "$type" \
    --vocab ../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf -o "$model" >/dev/null
load() { timeout 600 $nice node bench/serve_load.mjs "$@"; }
out=$bd/serve-results.jsonl
steplog=$bd/serve-steps.log # the runner's steps (CAIRN_STEP_LOG), read after each 8 streams
: >"$out"
serve_bin_json=$(sed 's/[\\"]/\\&/g' <<<"$serve_bin") # a path with a quote or backslash stays JSON
echo "{\"mode\":\"meta\",\"model\":\"llama-1b $type ($(basename "$model"))\",\"threads\":$threads,\"reps\":$reps,\"cpus\":$(nproc),\"ref_wait\":\"$ref_wait\",\"cairn\":\"$serve_bin_json\"}" >>"$out"

# The prompts must count exactly as many tokens as asked (BOS included).
for n in 128 2000; do
  for salt in 0 4321 15000; do
    got=$(node bench/serve_load.mjs prompt --tokens $n --salt $salt | $cairn tokenize -m "$model" --ids | wc -w)
    [ "$got" = "$n" ] || { echo "serve.sh: the $n-token prompt (salt $salt) tokenizes to $got tokens" >&2; exit 1; }
  done
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# wait_ready URL SECONDS: until a 1-token completion succeeds (the first places the model).
wait_ready() {
  local t=0
  until curl -sf -m 120 "$1/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$name\",\"prompt\":\"the\",\"max_tokens\":1,\"temperature\":0}" >/dev/null 2>&1; do
    sleep 1; t=$((t + 1))
    [ $t -lt "$2" ] || { echo "serve.sh: $1 did not answer in $2 s" >&2; return 1; }
  done
}

# stop PID: ends one server this script started.
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# Engine alone: prefill of 128 and 2000 tokens, decode, and the batch-cost curve.
echo "== engine: cairn bench" >&2
if [ $quick = 0 ]; then
eng=$($nice $cairn bench -m "$model" -p 128 -n 64 -t "$threads" -r 5 --batch-curve 16 --bandwidth-mib 256)
pp=$(sed -n 's/^pp128: .*, \([0-9.]*\) s[;)].*/\1/p' <<<"$eng")
tg=$(sed -n 's/^tg64: \([0-9.]*\) tok.*/\1/p' <<<"$eng")
curve=$(sed -n 's/^ *B= *\([0-9]*\): *[0-9.]* ms *x[0-9.]* *(\([0-9.]*\) tok\/s)/\1 \2/p' <<<"$eng" |
       awk '$1==1 {b=$2} $1~/^(1|2|4|8|16)$/ {printf "%sB=%s %s tok/s x%.2f", sep, $1, $2, $2/b; sep=", "}')
echo "{\"mode\":\"engine\",\"server\":\"cairn\",\"text\":\"cairn: prefill 128 tokens $(awk "BEGIN{printf \"%.1f\", $pp*1000}") ms; decode $tg tok/s; batch: $curve\"}" >>"$out"
eng2=$($nice $cairn bench -m "$model" -p 2000 -n 0 -t "$threads" -r 1 --batch-curve 0 --bandwidth-mib 256)
pp2=$(sed -n 's/^pp2000: .*, \([0-9.]*\) s[;)].*/\1/p' <<<"$eng2")
echo "{\"mode\":\"prefill\",\"server\":\"cairn\",\"prompt_tokens\":2000,\"ms\":$(awk "BEGIN{print $pp2*1000}")}" >>"$out"
fi

# prefill SERVER N: ms for the engine alone to prefill N tokens (warm weights).
prefill() {
  if [ "$1" = cairn ]; then
    # the median of 3 runs: the first also faults the mapped weights in
    $nice $cairn bench -m "$model" -p "$2" -n 0 -t "$threads" -r 3 --batch-curve 0 --bandwidth-mib 16 |
        sed -n 's/^pp[0-9]*: .*, \([0-9.]*\) s[;)].*/\1/p' | awk '{print $1 * 1000}'
  else
    $nice "${refenv[@]}" "$ref/llama-bench" -m "$model" -p "$2" -n 0 -t "$threads" -r 1 -o json 2>/dev/null |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{console.log(JSON.parse(s)[0].avg_ns/1e6)})'
  fi
}

# llama.cpp: its engine's prefill times and its server, if built.
ref=${LLAMA_REF_BIN:-$HOME/.cache/llama-ref/llama.cpp/build/bin}
if [ $no_ref = 0 ] && [ ! -x "$ref/llama-server" ] && [ $build_ref = 1 ]; then
  ref=$(bash bench/llama_ref.sh | tail -1)
fi
servers=(cairn)
if [ $no_ref = 1 ]; then
  echo "== llama-server: skipped (--no-ref)" >&2
elif [ ! -x "$ref/llama-server" ]; then
  echo "== llama-server: skipped ($ref/llama-server is not built; --build-ref builds it with ../shared/tools/llama-ref.sh)" >&2
else
  servers+=(llama.cpp)
  if [ -x "$ref/llama-bench" ]; then
    echo "== engine: llama-bench" >&2
    ms=$(prefill llama.cpp 2000) || ms=""
    [ -z "$ms" ] || echo "{\"mode\":\"prefill\",\"server\":\"llama.cpp\",\"prompt_tokens\":2000,\"ms\":$ms}" >>"$out"
  fi
fi
declare -A url=([cairn]=http://127.0.0.1:$port [llama.cpp]=http://127.0.0.1:$((port + 1)))
declare -A pid=()

# start SLOTS: every server with SLOTS slots (both stay up; an idle one takes no CPU), so
# that each measure runs against one and then the other under the same machine load.
start() {
  local data=$bd/serve-data
  rm -rf "$data"
  # --bandwidth-mib 64: the node's start-up probe of DRAM (placement's estimate, not used
  # here) would read 1-8 GiB while the first measures run.
  $nice env CAIRN_STEP_LOG="$steplog" "$serve_bin" node --api-port "$port" --cluster-port 0 --models-dir "$mdir" --data-dir "$data" \
      --discovery off -q -t "$threads" --parallel "$1" --bandwidth-mib 64 >$bd/serve-node.log 2>&1 &
  pid[cairn]=$!
  pids+=("$!")
  wait_ready "${url[cairn]}" 180
  if [ ${#servers[@]} -gt 1 ]; then
    # ctx is divided among the slots: each gets 2304 positions (2000-token prompt + streams).
    $nice "${refenv[@]}" "$ref/llama-server" -m "$model" -a "$name" --host 127.0.0.1 --port $((port + 1)) -t "$threads" \
        -tb "$threads" -np "$1" -c $(($1 * 2304)) >$bd/serve-llama.log 2>&1 &
    pid[llama.cpp]=$!
    pids+=("$!")
    wait_ready "${url[llama.cpp]}" 180
  fi
}
stop_all() { for s in "${servers[@]}"; do stop "${pid[$s]}"; done; }

# cpu_s PID: CPU seconds the process has used (user + system).
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# each MODE ARGS...: one run of a measure against every server in turn; for cairn's
# streams, the cores its runner and node used meanwhile (the runner's cores below its
# threads: the machine was busy or the runner waited).
each() {
  for s in "${servers[@]}"; do
    echo "== $s: $*" >&2
    local runner="" r0 n0 t0
    if [ "$s" = cairn ] && [ "$1" = streams ]; then
      runner=$(pgrep -P "${pid[cairn]}" -f ' runner ' | head -1) || runner=""
    fi
    [ -z "$runner" ] || { r0=$(cpu_s "$runner"); n0=$(cpu_s "${pid[cairn]}"); t0=$(date +%s.%N); }
    load "$@" --url "${url[$s]}" --model "$name" --server "$s" >>"$out"
    [ -z "$runner" ] || awk -v r0="$r0" -v r1="$(cpu_s "$runner")" -v n0="$n0" -v n1="$(cpu_s "${pid[cairn]}")" \
        -v t0="$t0" -v t1="$(date +%s.%N)" -v n="$3" \
        'BEGIN {printf "{\"mode\":\"cpu\",\"server\":\"cairn\",\"n\":%d,\"runner_cores\":%.2f,\"node_cores\":%.3f}\n", n, (r1 - r0) / (t1 - t0), (n1 - n0) / (t1 - t0)}' >>"$out"
  done
}
loadavg() { echo "{\"mode\":\"load\",\"loadavg\":$(cut -d' ' -f1 /proc/loadavg)}" >>"$out"; }

start 8
if [ $perf = 1 ]; then
  runner=$(pgrep -P "${pid[cairn]}" -f ' runner ' | head -1)
  echo "== perf: cairn runner $runner and node ${pid[cairn]} during 8 streams" >&2
  perf record -F 499 -g -o $bd/serve-runner.perf -p "$runner" -- sleep 20 2>/dev/null &
  p1=$!
  perf record -F 499 -g -o $bd/serve-node.perf -p "${pid[cairn]}" -- sleep 20 2>/dev/null &
  p2=$!
  load streams --url "${url[cairn]}" --model "$name" --server cairn-perf --n 8 --timeout-s 300 >/dev/null
  wait $p1 $p2 || true
  for w in runner node; do
    echo "-- perf: where the $w's time went (self time, top symbols; 9980 samples = one core busy for the 20 s)"
    { perf report -i $bd/serve-$w.perf --no-children --sort dso,symbol --stdio -g none 2>/dev/null |
        grep -E '^# Samples|^ +[0-9]' | head -25; } || true
  done
fi
# engine8: the engine alone just before and after the API's 8 streams, for the ratio the
# table states: its step of B = 8 sequences (tok/s of the batch curve) and its prefill of
# a 128-token prompt (tok/s), the median of 3 runs each (a 16 MiB bandwidth probe: the
# DRAM one takes seconds and is not needed here).
engine8() {
  local e b8 pp b8d curve
  e=$($nice $cairn bench -m "$model" -p 128 -n 0 -t "$threads" -r 3 --batch-curve 8 --bandwidth-mib 16)
  b8=$(sed -n 's/^ *B= *8: .*(\([0-9.]*\) tok\/s).*/\1/p' <<<"$e")
  pp=$(sed -n 's/^pp128: \([0-9.]*\) tok.*/\1/p' <<<"$e")
  # the same step with every sequence after 192 positions of its own context, as the 8
  # streams are on average (128-token prompts, 128 generated)
  e=$($nice $cairn bench -m "$model" -p 0 -n 0 -t "$threads" -r 3 --batch-curve 8 --batch-depth 192 --bandwidth-mib 16)
  b8d=$(sed -n 's/^ *B= *8 @ batch depth: .*(\([0-9.]*\) tok\/s).*/\1/p' <<<"$e")
  # the step of B = 1..8 at that depth (ms), for the serving account of the streams' steps
  # indexed by B (a B the bench did not print stays a hole: null, and no account is made)
  curve=$(sed -n 's/^ *B= *\([0-9]*\) @ batch depth: *\([0-9.]*\) ms.*/\1 \2/p' <<<"$e" |
    awk '{v[$1] = $2; if ($1 > m) m = $1} END {for (i = 1; i <= m; i++) printf "%s%s", (i > 1 ? "," : ""), ((i in v) ? v[i] : "null")}')
  [ -z "$b8" ] || [ -z "$pp" ] || [ -z "$b8d" ] || [ -z "$curve" ] ||
    echo "{\"mode\":\"engine8\",\"server\":\"cairn\",\"b8_tps\":$b8,\"b8_d192_tps\":$b8d,\"d192_curve_ms\":[$curve],\"pp128_tps\":$pp,\"loadavg\":$(cut -d' ' -f1 /proc/loadavg)}" >>"$out"
}

for r in $(seq "$reps"); do
  loadavg
  if [ $quick = 0 ]; then
    for n in 1 2 4; do
      each streams --n $n --timeout-s 300
    done
  fi
  echo "== cairn: engine B = 8, 8 streams and 8 clients back to back through the API, engine again" >&2
  engine8
  : >"$steplog"
  each streams --n 8 --timeout-s 300
  node bench/serve_load.mjs steps "$steplog" --server cairn >>"$out"
  each sustain --n 8 --rounds 3 --timeout-s 400
  engine8
  [ $quick = 1 ] && continue # part 3 only (--quick)
  # TTFT through HTTP right after the engine's own prefill of as many tokens, in pairs,
  # so that both see the same load; the table sets the lowest of each against the other.
  for i in 1 2 3; do
    for s in "${servers[@]}"; do
      echo "== $s: engine prefill and TTFT of 128 tokens" >&2
      ms=$(prefill "$s" 128) || ms=""
      [ -z "$ms" ] || echo "{\"mode\":\"prefill\",\"server\":\"$s\",\"prompt_tokens\":128,\"ms\":$ms}" >>"$out"
      load ttft --prompt-tokens 128 --reps 2 --timeout-s 120 --url "${url[$s]}" --model "$name" --server "$s" >>"$out"
    done
  done
  each ttft --prompt-tokens 2000 --reps 1 --timeout-s 300
  each interfere --streams 4 --long-tokens 2000 --timeout-s 400
done
stop_all
[ $quick = 1 ] && reps=0 # no 16 streams
[ $reps = 0 ] || start 16
for r in $(seq "$reps"); do
  loadavg
  each streams --n 16 --timeout-s 400
done
[ $reps = 0 ] || stop_all

node bench/serve_load.mjs table "$out"
