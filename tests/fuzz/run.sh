#!/usr/bin/env bash
# Builds each libFuzzer harness of tests/fuzz (clang, ASan + UBSan) and runs it for
# SECONDS (default 60) on a copy of its seed corpus, one after another; a crash, a leak or
# an input slower than 30 s fails the script, and the input that did it is left in
# build-fuzz/ (keep it in tests/fuzz/corpus/NAME/ once the bug is fixed).
#   usage: tests/fuzz/run.sh [SECONDS [HARNESS...]]     e.g. tests/fuzz/run.sh 300 fuzz_tok
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
[[ $secs =~ ^[0-9]+$ ]] || { echo "run.sh: '$secs' is not a number of seconds" >&2; exit 2; }
shift || true
command -v clang >/dev/null || { echo "run.sh: clang is required (apt-get install clang)" >&2; exit 2; }
out=build-fuzz
mkdir -p "$out"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Isrc -Itests)
libs=($(pkg-config --cflags --libs jansson libpcre2-8 libsodium libcrypto libmicrohttpd libzmq libcurl) -lpthread -lm)
# harness name -> the sources it needs
declare -A srcs=(
  [fuzz_api]="src/tok/grammar.c src/tok/jschema.c src/tok/tok*.c src/gguf/*.c src/api/openai.c src/api/responses.c src/api/ollama.c src/api/ollama_pull.c src/node/hubref.c src/api/anthropic.c src/api/apiutil.c src/api/apireq.c src/api/sse.c src/api/http*.c src/api/hosts.c src/api/json_scan.c src/ctl/*.c src/proto/*.c src/node/taskbody.c src/base/*.c"
  [fuzz_embed]="src/api/embeddings.c src/node/hubref.c src/tok/grammar.c src/tok/jschema.c src/tok/tok*.c src/gguf/*.c src/api/openai.c src/api/ollama.c src/api/ollama_pull.c src/api/apiutil.c src/api/apireq.c src/api/sse.c src/api/http*.c src/api/hosts.c src/api/json_scan.c src/ctl/*.c src/proto/*.c src/node/taskbody.c src/base/*.c"
  [fuzz_host]="src/api/hosts.c"
  [fuzz_jointoken]="src/net/jointoken.c src/base/err.c"
  [fuzz_hubref]="src/node/hubref.c src/base/err.c"
  [fuzz_hublist]="src/node/hub*.c src/node/sha256.c src/node/ranges.c src/node/catalog.c src/node/download.c src/model/arch.c src/model/extents.c src/gguf/*.c src/ctl/*.c src/proto/*.c src/base/*.c"
  [fuzz_bwcache]="src/node/bwcache.c src/base/*.c"
  [fuzz_link]="src/net/link_wire.c src/base/*.c"
  [fuzz_json_scan]="src/api/json_scan.c"
  [fuzz_gguf]="src/gguf/*.c src/model/arch.c src/base/*.c"
  [fuzz_model]="src/model/arch.c src/model/extents.c src/gguf/*.c src/base/*.c"
  [fuzz_tok]="src/tok/*.c src/gguf/*.c src/base/*.c"
  [fuzz_vocab]="src/tok/*.c src/gguf/*.c src/base/*.c"
  [fuzz_splitters]="src/tok/toolcall.c src/tok/reasoning.c src/tok/stopstr.c src/base/*.c"
  [fuzz_harmony]="src/tok/harmony.c src/tok/toolcall.c src/tok/stopstr.c src/base/*.c"
  [fuzz_grammar]="src/tok/grammar.c src/tok/jschema.c src/tok/tok*.c src/gguf/*.c src/base/*.c"
  [fuzz_tmpl]="src/tmpl/*.c src/tok/*.c src/gguf/*.c src/base/*.c"
  [fuzz_event]="src/ctl/*.c src/proto/*.c src/base/*.c"
  [fuzz_runner]="src/proto/*.c src/node/taskbody.c src/base/*.c"
  [fuzz_handshake]="src/net/discovery.c src/runner/dataplane_wire.c src/kern/quant.c src/kern/quantize.c src/kern/convert.c src/kern/half.c src/node/download.c src/node/catalog.c src/node/hub*.c src/node/sha256.c src/node/ranges.c src/model/arch.c src/model/extents.c src/gguf/*.c src/ctl/*.c src/proto/*.c src/base/*.c"
  [fuzz_dataplane]="src/runner/dataplane_wire.c src/runner/dataplane_seal.c src/kern/quant.c src/kern/quantize.c src/kern/convert.c src/kern/half.c src/base/*.c"
)
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=($(printf '%s\n' "${!srcs[@]}" | sort))
# Build them all first, as many at once as there are cores.
pids=()
for h in "${harnesses[@]}"; do
  [ -n "${srcs[$h]:-}" ] || { echo "run.sh: no harness $h" >&2; exit 2; }
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do sleep 0.2; done
  # shellcheck disable=SC2086 # the globs are meant to expand
  clang "${flags[@]}" -o "$out/$h" "tests/fuzz/$h.c" ${srcs[$h]} "${libs[@]}" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "run.sh: a harness did not build" >&2; exit 1; }; done
# gpt-oss's vocabulary for fuzz_tok, where node and the e2e packages are here to write it
if [ -z "${CAIRN_FUZZ_O200K:-}" ] && [ -d tests/e2e/node_modules/js-tiktoken ] && command -v node >/dev/null &&
    node tests/e2e/o200k.mjs "$out/o200k.gguf" >/dev/null; then
  export CAIRN_FUZZ_O200K=$out/o200k.gguf
fi
for h in "${harnesses[@]}"; do
  corpus=$out/corpus-$h
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"${h#fuzz_}"/* "$corpus"/
  echo "== $h for $secs s"
  if ! "$out/$h" -max_total_time="$secs" -timeout=30 -print_final_stats=1 -artifact_prefix="$out/$h-" \
      "$corpus" >"$out/$h.log" 2>&1; then
    tail -n 60 "$out/$h.log"
    echo "run.sh: $h failed; the input is $(ls -t "$out/$h"-* 2>/dev/null | head -n 1)" >&2
    exit 1
  fi
  grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|peak_rss_mb|new_units_added)' "$out/$h.log"
done
