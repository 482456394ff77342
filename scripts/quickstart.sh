#!/usr/bin/env bash
# Builds cairn, writes a synthetic model of Llama-3.2-1B's shape (seeded random weights,
# Llama 3's real vocabulary and chat template), generates from it, measures it, then
# serves it: a `cairn node` on loopback answers an OpenAI chat request, a streamed Ollama
# one and `cairn run` with a prompt, `cairn status` shows it, and, when this runs on a
# terminal, `cairn run` opens a chat with the model (Ctrl-D leaves); then the node stops.
# Nothing is downloaded. (The random weights make the answers gibberish: the machinery is
# what is shown.)
#   usage: scripts/quickstart.sh [SHAPE] [TYPE]      (default: llama-1b q4_0)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target cairn
shape=${1:-llama-1b}; type=${2:-q4_0}
vocab=../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf
case "$shape" in qwen*) vocab=../shared/testdata/vocab/ggml-vocab-qwen2.gguf ;; tiny|small) vocab=../shared/testdata/vocab/ggml-vocab-llama-spm.gguf ;; esac
model=build/models/$shape-$type.gguf
mkdir -p build/models
tmpl=../shared/testdata/templates/meta-llama-Llama-3.2-3B-Instruct.jinja
case "$shape" in qwen*) tmpl=../shared/testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja ;; esac
[ -f "$model" ] || ./build/cairn mkmodel --shape "$shape" --type "$type" --vocab "$vocab" --chat-template "$tmpl" -o "$model"
./build/cairn generate -m "$model" -p "The cairn on the hill" -n 32 --seed 7 --temp 0.8 --top-p 0.9 -t "$(nproc)"
./build/cairn bench -m "$model" -p 128 -n 32 -r 2 --batch-curve 8 -t "$(nproc)"

# Serving: a node of its own (loopback, discovery off, its own data dir), two requests.
port=18435
data=$(mktemp -d)
./build/cairn node --api-port $port --cluster-port 0 --bind 127.0.0.1 --discovery off --models-dir build/models \
  --data-dir "$data" -t "$(nproc)" -q &
node_pid=$!
trap 'kill $node_pid 2>/dev/null; wait $node_pid 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 1 100); do curl -sf localhost:$port/v1/models >/dev/null && break; sleep 0.2; done
id=$(basename "$model" .gguf)
echo "== POST /v1/chat/completions ($id, placed on demand)"
curl -s localhost:$port/v1/chat/completions -d "{\"model\":\"$id\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}"
echo
echo "== POST /api/chat (Ollama, streamed)"
curl -s localhost:$port/api/chat -d "{\"model\":\"$id\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"options\":{\"num_predict\":4}}"
echo
echo "== cairn run (one answer, through the node)"
./build/cairn run --host 127.0.0.1:$port "$id" --set max_tokens=24 "Hello"
echo "== cairn status"
./build/cairn status --host 127.0.0.1:$port
if [ -t 0 ] && [ -t 1 ]; then
  echo "== cairn run: a chat with $id (Ctrl-D leaves)"
  ./build/cairn run --host 127.0.0.1:$port "$id" --set max_tokens=64
fi
