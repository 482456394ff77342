#!/usr/bin/env bash
# Builds each libFuzzer harness of tests/fuzz (clang, ASan + UBSan) and runs it for
# SECONDS (default 60) on a copy of its seed corpus; a crash fails the script.
#   usage: tests/fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
[[ $secs =~ ^[0-9]+$ ]] || { echo "run.sh: '$secs' is not a number of seconds" >&2; exit 2; }
command -v clang >/dev/null || { echo "run.sh: clang is required (apt-get install clang)" >&2; exit 2; }
out=build-fuzz
mkdir -p "$out"
flags=(-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Isrc)
# harness name -> the sources it needs
declare -A srcs=([fuzz_host]="src/api/hosts.c")
for h in "${!srcs[@]}"; do
  clang "${flags[@]}" -o "$out/$h" "tests/fuzz/$h.c" ${srcs[$h]}
  corpus=$out/corpus-$h
  mkdir -p "$corpus"
  cp tests/fuzz/corpus/"${h#fuzz_}"/* "$corpus"/
  echo "== $h for $secs s"
  "$out/$h" -max_total_time="$secs" -print_final_stats=1 "$corpus" 2>&1 | tail -n 12
done
