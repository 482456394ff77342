#!/usr/bin/env bash
# What an idle cluster costs (issue 14): NODES `cairn node` processes on 127.0.0.1
# (--discovery off, each joined to the first by --peer, nothing placed) are started and
# left alone; once the first node's /state lists all of them, the script waits SETTLE
# seconds, then measures over WINDOW seconds the CPU time the kernel charged each node
# (utime + stime of all its threads, /proc/PID/stat) and the load average. It prints the
# CPU, each node's share of a core (median, highest), all nodes' sum, and the 1-minute
# load average at the end (which counts other work on the machine too).
#   usage: bench/idle.sh [--nodes N] [--settle S] [--window S] [--build-dir DIR]
#          (defaults: 25 nodes, 30 s settle, 60 s window, build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=25 settle=30 window=60 bd=build-bench
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --window) window=$2; shift 2 ;;
    --build-dir) bd=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "idle.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$nodes" "$settle" "$window"; do
  [[ $v =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || { echo "idle.sh: '$v' is not a positive integer" >&2; exit 2; }
done
[ "$nodes" -le 64 ] || { echo "idle.sh: at most 64 nodes" >&2; exit 2; }
cmake -S . -B "$bd" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$bd" -j2 --target cairn >/dev/null
cairn=$(cd "$bd" && pwd)/cairn
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# start NAME ARGS...: a node with its own data dir and log, on kernel-chosen ports.
start() {
  local name=$1; shift
  mkdir -p "$tmp/$name"
  XDG_DATA_HOME=$tmp/$name XDG_CACHE_HOME=$tmp/$name HOME=$tmp/$name \
    "$cairn" node --api-host 127.0.0.1 --api-port 0 --bind 127.0.0.1 --cluster-port 0 --discovery off \
    --no-worker --data-dir "$tmp/$name/data" "$@" >"$tmp/$name/log" 2>&1 &
  pids+=($!)
}
# port NAME WHAT: the port a node logged ("api 127.0.0.1:P" or "cluster port P"), waiting up to 30 s.
port() {
  local p=""
  for _ in $(seq 300); do
    p=$(sed -n "s/.*$2[: ]\([0-9][0-9]*\).*/\1/p" "$tmp/$1/log" | head -n 1)
    [ -n "$p" ] && { echo "$p"; return; }
    sleep 0.1
  done
  echo "idle.sh: node $1 did not log its $2" >&2; tail -n 20 "$tmp/$1/log" >&2; exit 1
}

start n0
cport=$(port n0 'cluster port')
api=$(port n0 'api 127.0.0.1')
for i in $(seq 1 $((nodes - 1))); do start "n$i" --peer "127.0.0.1:$cport"; done
count() { curl -sf "http://127.0.0.1:$api/state" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["nodes"]))'; }
t0=$(date +%s)
until [ "$(count 2>/dev/null || echo 0)" -eq "$nodes" ]; do
  [ $(( $(date +%s) - t0 )) -lt 180 ] || { echo "idle.sh: $nodes nodes did not join within 180 s" >&2; exit 1; }
  sleep 1
done
echo "$nodes nodes joined in $(( $(date +%s) - t0 )) s; settling $settle s, then measuring $window s" >&2
sleep "$settle"

cpu() { awk '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " "); print f[12] + f[13] }' "/proc/$1/stat"; }
before=()
for p in "${pids[@]}"; do before+=("$(cpu "$p")"); done
sleep "$window"
shares=()
for i in "${!pids[@]}"; do
  shares+=("$(awk -v a="${before[$i]}" -v b="$(cpu "${pids[$i]}")" -v w="$window" \
    'BEGIN { printf "%.3f", (b - a) / 100 / w * 100 }')")
done
read -r load1 _ </proc/loadavg
sorted=$(printf '%s\n' "${shares[@]}" | sort -g)
median=$(echo "$sorted" | sed -n "$(( (nodes + 1) / 2 ))p")
highest=$(echo "$sorted" | tail -n 1)
sum=$(printf '%s\n' "${shares[@]}" | awk '{ s += $1 } END { printf "%.2f", s }')
cpu_name=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "CPU: $cpu_name, $(nproc) cores; $nodes idle nodes, ${window} s window after ${settle} s"
echo "| figure | value |"
echo "|---|---:|"
echo "| one node's CPU, % of a core (median) | $median |"
echo "| one node's CPU, % of a core (highest) | $highest |"
echo "| all $nodes nodes, % of a core | $sum |"
echo "| load average (1 min) at the end | $load1 |"
