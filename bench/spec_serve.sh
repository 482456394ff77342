#!/usr/bin/env bash
# Speculative decoding through the API against `cairn bench --draft`, on the pair of
# issue 23: a `small` Q8_0 target whose layers from 2 on are scaled by F (mkmodel
# --scale-from 2 --scale F) and the draft of its first 2 layers (--draft-of), k drafts.
#   1. `cairn bench --draft` (-p 64 -n 64): acceptance, the draft's cost c and the
#      verify cost v against a target step, the draft's share of the bytes a step reads,
#      measured and predicted speed-up and their ratio (efficiency);
#   2. a `cairn node` with the pair placed (draft_model, num_draft_tokens k): one stream
#      at a time, requests without drafts (num_draft_tokens 0) and with them in turn,
#      REPS of each, on the bench's own 64 prompt ids (so that the draft is accepted as
#      often: usage's accepted/drafted is printed beside the bench's), 64 greedy tokens;
#      the speed-up is each drafted request's decode rate over the plain one's before it;
#   3. `cairn bench --draft` again.
# Efficiency through the API = its median speed-up / the predicted speed-up, the mean of
# the two bench runs' ((1 - a^(k+1)) / (1 - a)) / (k c + v). Load average printed: on a
# shared machine single speed-ups move by 10-20%.
#   usage: bench/spec_serve.sh [-t THREADS] [-k K] [-F SCALE] [-r REPS] [--port N]
#   env: CAIRN_BUILD  build folder holding (or to build) cairn (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 k=4 F=0.05 reps=5 port=18691
while [ $# -gt 0 ]; do
  case $1 in
    -t) threads=$2; shift 2 ;;
    -k) k=$2; shift 2 ;;
    -F) F=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "spec_serve.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
command -v node >/dev/null || { echo "spec_serve.sh: node is required for the requests" >&2; exit 1; }
build=${CAIRN_BUILD:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build "$build" -j2 --target cairn >/dev/null
cairn=$build/cairn
dir=$build/spec-serve
mdir=$dir/models
mkdir -p "$mdir"
t=$mdir/small-q8_0-f$F.gguf d=$mdir/small-q8_0-f$F-d2.gguf
[ -f "$t" ] || $cairn mkmodel --shape small --type q8_0 --vocab ../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf \
    --scale-from 2 --scale "$F" -o "$t" >/dev/null
[ -f "$d" ] || $cairn mkmodel --draft-of "$t" --layers 2 -o "$d" >/dev/null
tname=$(basename "$t" .gguf) dname=$(basename "$d" .gguf)
echo "spec_serve.sh: small Q8_0 (F $F) + 2-layer draft, k = $k, $threads threads; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"

preds=()
bench() {
  local out
  out=$($cairn bench -m "$t" --draft "$d" --draft-tokens "$k" -p 64 -n 64 -t "$threads" -r 1)
  grep -E '^(target decode|bytes a step|  (plain|speculative) decode|drafted|speed-up|efficiency)' <<<"$out" | sed 's/^/  /'
  preds+=("$(sed -n 's/^speed-up: .*predicted \([0-9.]*\)x.*/\1/p' <<<"$out")")
}
echo "== cairn bench --draft (load $(cut -d' ' -f1 /proc/loadavg))"
bench

data=$dir/data
rm -rf "$data"
pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true' EXIT
$cairn node --api-port "$port" --cluster-port 0 --models-dir "$mdir" --data-dir "$data" --discovery off -q \
    -t "$threads" --bandwidth-mib 64 >"$dir/node.log" 2>&1 &
pid=$!
url=http://127.0.0.1:$port
for i in $(seq 60); do curl -sf "$url/node_id" >/dev/null 2>&1 && break; sleep 0.5; done
curl -sf -XPOST "$url/place_instance" \
    -d "{\"model_id\":\"$tname\",\"draft_model\":\"$dname\",\"num_draft_tokens\":$k}" >/dev/null
for i in $(seq 120); do
  curl -sf -m 60 "$url/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"$tname\",\"prompt\":\"the\",\"max_tokens\":1,\"temperature\":0}" >/dev/null 2>&1 && break
  sleep 1
done
echo "== through the API: $reps requests without drafts and $reps with, in turn (load $(cut -d' ' -f1 /proc/loadavg))"
api=$(timeout 600 node bench/serve_load.mjs spec --url "$url" --model "$tname" --reps "$reps" --prompt-tokens 64 --gen 64)
echo "  $api"
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""

echo "== cairn bench --draft again (load $(cut -d' ' -f1 /proc/loadavg))"
bench
node -e '
const a = JSON.parse(process.argv[1]), p = process.argv.slice(2).map(Number).filter((x) => x > 0);
const pred = p.reduce((s, x) => s + x, 0) / p.length;
console.log(`through the API: speed-up ${a.speedup_median}x (median of ${a.reps}: ${a.speedups.join(", ")}), ` +
  `accepted/drafted ${a.accepted[0]}/${a.drafted[0]}, ${a.tokens_per_step} tokens a verify step; ` +
  `predicted ${pred.toFixed(2)}x (mean of the bench runs): efficiency ${(a.speedup_median / pred).toFixed(2)}`);
' "$api" "${preds[@]}"
