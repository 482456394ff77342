#!/usr/bin/env bash
# Figures of the cluster control plane (issue 4), measured on one machine:
#   - events applied per second by the pure cluster_apply: tests/ctl/test_apply.c
#     with CAIRN_BENCH=1 applies EVENTS random events (made beforehand; a term snapshot
#     about every 200) to a fresh state, and says the rate with and without snapshots;
#   - from tests/cli/test_node.c, real `cairn node` processes on 127.0.0.1 with
#     --discovery off joined by --peer: seconds from starting three nodes until all three
#     show the same /state of three nodes; seconds from the master's kill -9 until the
#     two others agree on a new master, and until the instance on a survivor answers a
#     completion again (same runner, not restarted); the RSS of an idle node just joined
#     (the largest of the three).
# Each is measured RUNS times; the table gives the median, the lowest and the highest.
# Other work on the machine slows every figure (the load average is printed).
#   usage: bench/cluster.sh [--runs N] [--events N] [--build-dir DIR]
#          (defaults: 3 runs, 1000000 events, build-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3 events=1000000 bd=build-bench
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --events) events=$2; shift 2 ;;
    --build-dir) bd=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "cluster.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$runs" "$events"; do
  [[ $v =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || { echo "cluster.sh: '$v' is not a positive integer" >&2; exit 2; }
done
cmake -S . -B "$bd" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$bd" -j2 --target cairn test_apply test_node >/dev/null
bd=$(cd "$bd" && pwd)
log=$bd/cluster-bench.log
: >"$log"

# figure FILE SED-PATTERN: the number the pattern's group catches in FILE's figure lines.
figure() { sed -n "s/^figure: $2.*/\\1/p" "$1" | head -n 1; }

apply=() join=() master=() answer=() rss=()
for r in $(seq "$runs"); do
  out=$bd/cluster-apply-$r.out
  (cd "$bd" && CAIRN_BENCH=1 CAIRN_BENCH_EVENTS=$events ./test_apply) >"$out" 2>&1 ||
    { cat "$out" >&2; echo "cluster.sh: test_apply failed (run $r)" >&2; exit 1; }
  cat "$out" >>"$log"
  apply+=("$(figure "$out" 'apply \([0-9.]*\) events\/s')")
  out=$bd/cluster-node-$r.out
  (cd "$bd" && ./test_node) >"$out" 2>&1 ||
    { tail -n 40 "$out" >&2; echo "cluster.sh: test_node failed (run $r)" >&2; exit 1; }
  cat "$out" >>"$log"
  join+=("$(figure "$out" 'three nodes see each other \([0-9.]*\) s')")
  master+=("$(figure "$out" 'master loss -> new master \([0-9.]*\) s')")
  answer+=("$(figure "$out" 'master loss -> completion answered \([0-9.]*\) s')")
  rss+=("$(figure "$out" 'idle node RSS \([0-9]*\) KiB')")
  echo "run $r: apply ${apply[-1]}/s, join ${join[-1]} s, new master ${master[-1]} s," \
       "answers ${answer[-1]} s, idle RSS ${rss[-1]} KiB" >&2
done

# stats SCALE DIGITS VALUES...: "median | lowest | highest", each divided by SCALE.
stats() {
  local scale=$1 digits=$2
  shift 2
  printf '%s\n' "$@" | sort -g | awk -v s="$scale" -v d="$digits" '
    { v[NR] = $1 / s }
    END {
      if (NR == 0) { print "- | - | -"; exit }
      m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      f = "%." d "f"
      printf(f " | " f " | " f "\n", m, v[1], v[NR])
    }'
}

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo
echo "$(nproc) cores ($cpu), load average $(cut -d' ' -f1-3 /proc/loadavg), $runs runs;" \
     "\`bench/cluster.sh --runs $runs --events $events\`"
echo
echo "| Figure | Median | Lowest | Highest |"
echo "|---|---:|---:|---:|"
echo "| events applied per second by \`apply\` (millions; $events random events) | $(stats 1e6 2 "${apply[@]}") |"
echo "| three nodes started -> all see the same state (s) | $(stats 1 2 "${join[@]}") |"
echo "| master killed (kill -9) -> the others agree on a new master (s) | $(stats 1 2 "${master[@]}") |"
echo "| master killed -> its instance on a survivor answers again (s) | $(stats 1 2 "${answer[@]}") |"
echo "| RSS of an idle node (MiB) | $(stats 1024 1 "${rss[@]}") |"
echo
echo "(the runs' output: $log)"
