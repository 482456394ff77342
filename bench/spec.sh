#!/usr/bin/env bash
# Speculative decoding, measured: cairn bench --draft / --lookup and llama.cpp's
# llama-speculative-simple on the same synthetic GGUF files, same machine, same threads.
# Targets are llama-1b (Q4_0, Q8_0) whose layers from L on are scaled by F
# (mkmodel --scale-from L --scale F), so that the draft of their first L = 2 or 4 layers
# (mkmodel --draft-of, sharing the target's embeddings and head) agrees with them at a rate
# set by F (smaller F: higher); prompt lookup runs on a model whose greedy text is a
# 12-token loop. Models go to $CAIRN_BUILD/spec (about 7 GB quick, 14 GB full, 20 with 8B).
# Prints one Markdown table, then the draft's cost split into layers and the shared part.
#   usage: bench/spec.sh [--quick] [--threads N] [--budget MINUTES]
#     --quick    fewer F values and k for Q8_0, no llama-8b
#     --budget   stop starting new runs when they would not end in time (default 30, quick 25)
#   env: CAIRN_BUILD  build folder holding (or to build) cairn (default: build)
# Sized for a shared 2-core machine: short runs (cairn -p 64 -n 64, llama.cpp -n 32, one run), so single
# figures move by 10-20% between runs when the machine is busy; c, v and alpha are steadier
# than the measured speed-ups. llama.cpp comes from ../shared/tools/llama-ref.sh (never
# committed); if a llama.cpp run fails, the reason is printed and the table says so.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0; threads=2; budget=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --budget) budget=$2; shift ;;
    *) echo "usage: bench/spec.sh [--quick] [--threads N] [--budget MINUTES]" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$budget" ] || budget=$([ $quick = 1 ] && echo 25 || echo 30)
exec </dev/null
start=$SECONDS; deadline=$((start + budget * 60))
npred=64; nprompt=64; nllama=32   # llama.cpp runs are shorter: at 2 threads on a busy machine it is slow

build=${CAIRN_BUILD:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build "$build" -j"$(nproc)" --target cairn >/dev/null
cairn=$build/cairn
vocab=../shared/testdata/vocab/ggml-vocab-llama-bpe.gguf
dir=$build/spec; logs=$dir/logs
mkdir -p "$dir" "$logs"
ref=$(bash bench/llama_ref.sh 2>/dev/null | tail -1) || ref=""
[ -x "$ref/llama-speculative-simple" ] || { echo "llama.cpp's llama-speculative-simple not found: its column stays empty"; ref=""; }

if [ $quick = 1 ]; then
  q4_fs="0.1 0.02"; q8_fs="0.05"; q8_ls="2"; lookup_ks="4 8"
else
  q4_fs="0.1 0.05 0.02"; q8_fs="0.1 0.02"; q8_ls="2 4"; lookup_ks="2 4 8"
fi
ks="2 4 8"
prompt="In the beginning of the project the team wrote a small program that read a file of numbers, added them up and printed the total. Over the years it grew into a service with many users, a database, a web front end, a queue of jobs and a cluster of machines that nobody fully understood any more."

echo "spec.sh: $threads threads, budget $budget min$([ $quick = 1 ] && echo ', quick'); load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

left() { echo $((deadline - SECONDS)); }
# fits SECONDS_NEEDED: whether a step of about that length still ends before the deadline
fits() { [ "$(left)" -gt "$1" ]; }

# mk FILE ARGS...: writes a model unless it is there (removed on failure)
mk() {
  local f=$1; shift
  [ -f "$f" ] && return 0
  "$cairn" mkmodel "$@" -o "$f" >/dev/null || { rm -f "$f"; echo "mkmodel failed for $f" >&2; return 1; }
}
target_file() { echo "$dir/$1-$2-f$3-s$4.gguf"; }       # shape type F L (scaled from layer L)
draft_file() { echo "${1%.gguf}-d$2.gguf"; }            # target layers

# Rows of the table, one per line, tab-separated fields:
# name L F k alpha c v measured predicted efficiency same acc/drafted llama_acc llama_speedup
rows=$dir/rows.tsv; : >"$rows"
# Sizes per (target, L) for the cost split: name L target_MiB n_layers draft_MiB
sizes=$dir/sizes.tsv; : >"$sizes"
t_cairn=40; t_llama=60   # running estimates of one run's seconds, updated as runs end

# cairn_row NAME L F K TARGET (DRAFT | lookup:N)
cairn_row() {
  local name=$1 L=$2 F=$3 k=$4 t=$5 d=$6 log t0=$SECONDS
  log=$logs/cairn-$(basename "${t%.gguf}")-$L-k$k.log
  local mode=(--draft "$d"); [[ $d == lookup:* ]] && mode=(--lookup "${d#lookup:}")
  if ! fits "$t_cairn"; then echo "  skipped (budget): cairn $name L=$L F=$F k=$k"; return 0; fi
  if ! timeout 600 "$cairn" bench -m "$t" "${mode[@]}" --draft-tokens "$k" -p $nprompt -n $npred -t "$threads" -r 1 >"$log" 2>&1; then
    echo "  cairn bench failed ($name L=$L k=$k): $(tail -1 "$log")"
  fi
  t_cairn=$(( (SECONDS - t0) * 5 / 4 + 5 ))
  local c v alpha meas pred eff same da
  c=$(sed -n 's/.*(c = \([0-9.]*\)).*/\1/p' "$log")
  v=$(sed -n 's/.*(v = \([0-9.]*\)).*/\1/p' "$log")
  alpha=$(sed -n 's/^drafted.* = \([0-9.]*\)$/\1/p' "$log")
  da=$(sed -n 's/^drafted \([0-9]*\), accepted \([0-9]*\),.*/\2\/\1/p' "$log")
  meas=$(sed -n 's/^speed-up: measured \([0-9.]*\)x.*/\1/p' "$log")
  pred=$(sed -n 's/^speed-up: .*predicted \([0-9.]*\)x.*/\1/p' "$log")
  eff=$(sed -n 's/^efficiency[^:]*: \([0-9.]*\)$/\1/p' "$log")
  same=$(sed -n 's/^greedy tokens identical to the plain run: \(.*\)$/\1/p' "$log")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$L" "$F" "$k" "${alpha:--}" "${c:--}" \
    "${v:--}" "${meas:--}" "${pred:--}" "${eff:--}" "${same:-failed}" "${da:--}" "-" "-" "$t" >>"$rows"
  echo "  cairn $name L=$L F=$F k=$k: alpha ${alpha:-?} c ${c:-?} v ${v:-?} speed-up ${meas:-?}x (predicted ${pred:-?}x) [$((SECONDS - t0)) s]"
  if [[ $d != lookup:* ]] && [ -n "$c" ] && ! grep -q "^$name	" "$sizes"; then
    local tm n dm
    tm=$(sed -n 's/^target: .*(\([0-9]*\) layers, \([0-9.]*\) MiB.*/\2/p' "$log")
    n=$(sed -n 's/^target: .*(\([0-9]*\) layers, .*/\1/p' "$log")
    dm=$(sed -n 's/^draft: .*layers, \([0-9.]*\) MiB.*/\1/p' "$log")
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$L" "$tm" "$n" "$dm" >>"$sizes"   # one line per target type
  fi
}

# llama_tg TARGET: llama.cpp's plain decode speed (tokens/s, llama-bench tg), or "none"
llama_tg() {
  local out v
  out=$(timeout 300 "$ref/llama-bench" -m "$1" -p 0 -n $nllama -t "$threads" -r 1 -o md 2>&1) || true
  v=$(echo "$out" | awk -F'|' '/tg[0-9]/ {split($(NF-1), a, " "); print a[1]}')
  [ -n "$v" ] || { echo "  llama-bench failed on $1: $(echo "$out" | tail -1)" >&2; v=none; }
  echo "$v"
}
prev_t=""; prev_tg=""   # the last plain measurement, reused as the next run's "before" on the same file

# llama_row ROW_INDEX: runs llama-speculative-simple for the row and fills its two columns
llama_row() {
  local i=$1 line name L F k t log t0=$SECONDS
  line=$(sed -n "${i}p" "$rows")
  IFS=$'\t' read -r name L F k _ _ _ _ _ _ _ _ _ _ t <<<"$line"
  if ! fits "$t_llama"; then echo "  skipped (budget): llama.cpp $name L=$L F=$F k=$k"; return 0; fi
  # plain speed just before and just after the speculative run: the load on this machine
  # changes within minutes, and a baseline from another time would make the ratio meaningless
  local before after
  if [ "$prev_t" = "$t" ]; then before=$prev_tg; else before=$(llama_tg "$t"); fi
  local spec=(--spec-type draft-simple -md "$(draft_file "$t" "$L")" --spec-draft-n-max "$k")
  [[ $L == lookup* ]] && spec=(--spec-type ngram-simple --spec-ngram-simple-size-n "${L#lookup }" --spec-ngram-simple-size-m "$k")
  log=$logs/llama-$(basename "${t%.gguf}")-${L// /}-k$k.log
  timeout 600 "$ref/llama-speculative-simple" -m "$t" "${spec[@]}" -p "$prompt" -n $nllama -t "$threads" \
    --temp 0 -c 1024 >"$log" 2>&1 || true
  after=$(llama_tg "$t"); prev_t=$t; prev_tg=$after
  t_llama=$(( (SECONDS - t0) * 5 / 4 + 5 ))
  local tps acc sp="-" base=none
  [ "$before" != none ] && [ "$after" != none ] && base=$(awk -v a="$before" -v b="$after" 'BEGIN {print (a + b) / 2}')
  tps=$(sed -n 's/.*decoded .* speed: *\([0-9.]*\) t\/s.*/\1/p' "$log" | tail -1)
  acc=$(sed -n 's/.* n_accept *= *\([0-9]*\).*/\1/p' "$log" | tail -1)/$(sed -n 's/.* n_drafted *= *\([0-9]*\).*/\1/p' "$log" | tail -1)
  if [ -z "$tps" ]; then
    sp="failed"; acc="-"
    echo "  llama.cpp failed ($name L=$L k=$k): $(grep -aiE 'error|fail' "$log" | tail -1 | cut -c1-160)"
  elif [ "$base" != none ]; then
    # a plain speed that moved by more than 25% between before and after is flagged
    sp=$(awk -v a="$tps" -v b="$base" -v x="$before" -v y="$after" \
      'BEGIN {printf "%.2fx%s", a / b, (x > 1.25 * y || y > 1.25 * x) ? " (unsteady)" : ""}')
  fi
  awk -F'\t' -v OFS='\t' -v i="$i" -v acc="$acc" -v sp="$sp" 'NR == i {$13 = acc; $14 = sp} {print}' "$rows" >"$rows.new" && mv "$rows.new" "$rows"
  echo "  llama.cpp $name L=$L F=$F k=$k: accepted/drafted $acc, ${tps:-?} tok/s against $before, $after plain: $sp [$((SECONDS - t0)) s]"
}

echo "== models (in $dir)"
pairs=()   # "type F L k..." for each target and draft written
for type in q4_0 q8_0; do
  if [ $type = q4_0 ]; then fs=$q4_fs; ls="2 4"; else fs=$q8_fs; ls=$q8_ls; fi
  first=1
  for F in $fs; do
    # a 1-layer draft (k = 4 only) at the first F: a third point for the cost split
    for L in $([ $type = q4_0 ] && [ $first = 1 ] && echo 1) $ls; do
      t=$(target_file llama-1b $type "$F" "$L")
      mk "$t" --shape llama-1b --type $type --vocab "$vocab" --scale-from "$L" --scale "$F" &&
        mk "$(draft_file "$t" "$L")" --draft-of "$t" --layers "$L" && pairs+=("$type $F $L $([ "$L" = 1 ] && echo 4 || echo "$ks")")
    done
    first=0
  done
done
loop=$dir/llama-1b-q4_0-loop.gguf
mk "$loop" --shape llama-1b --type q4_0 --vocab "$vocab" --script-ids "$(seq -s, 1000 1011),1000" || true
echo "  done at $((SECONDS - start)) s"

echo "== cairn bench --draft / --lookup (-p $nprompt -n $npred -t $threads -r 1)"
run_pairs() {   # TYPE: the cairn rows of that type's pairs
  local p type F L k t pks
  for p in "${pairs[@]}"; do
    read -r type F L pks <<<"$p"
    [ "$type" = "$1" ] || continue
    t=$(target_file llama-1b "$type" "$F" "$L")
    for k in $pks; do cairn_row "llama-1b ${type^^}" "$L" "$F" "$k" "$t" "$(draft_file "$t" "$L")"; done
  done
}
run_pairs q4_0
[ -f "$loop" ] && for k in $lookup_ks; do cairn_row "llama-1b Q4_0, 12-token loop" "lookup 3" "-" "$k" "$loop" lookup:3; done
run_pairs q8_0

# llama.cpp, k = 4 first for every pair, then llama-8b, then the other k
llama_pass() {
  [ -n "$ref" ] || return 0
  local i
  # rows (by line number) with one of the given k whose cairn run worked
  for i in $(awk -F'\t' -v ks=" $* " 'index(ks, " " $4 " ") && $11 != "failed" && $13 == "-" {print NR}' "$rows"); do
    llama_row "$i"
  done
}
echo "== llama.cpp llama-speculative-simple, k = 4 (same files, English prompt of ~60 tokens, -n $nllama)"
llama_pass 4

echo "== llama-8b Q4_0, 4-layer draft"
big=$(target_file llama-8b q4_0 0.05 4)
mem_gib=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
disk_gib=$(df -Pk "$dir" | awk 'NR == 2 {print int($4 / 1048576)}')
if [ $quick = 1 ]; then
  echo "  skipped (--quick)"
elif [ "$mem_gib" -lt 10 ] || [ "$disk_gib" -lt 12 ]; then
  echo "  skipped: needs 10 GiB of free memory and 12 GiB of disk (have $mem_gib and $disk_gib)"
elif ! fits 420; then
  echo "  skipped: $(left) s of the budget left"
else
  mk "$big" --shape llama-8b --type q4_0 --vocab "$vocab" --scale-from 4 --scale 0.05 &&
    mk "$(draft_file "$big" 4)" --draft-of "$big" --layers 4 &&
    t_cairn=180 && for k in 4 8; do cairn_row "llama-8b Q4_0" 4 0.05 $k "$big" "$(draft_file "$big" 4)"; done
  t_llama=240
  [ -n "$ref" ] && for i in $(awk -F'\t' '$1 == "llama-8b Q4_0" && $11 != "failed" {print NR}' "$rows"); do
    llama_row "$i"
  done
fi

echo "== llama.cpp, k = 2 and 8"
llama_pass 2 8

echo
echo "## Speculative decoding, $(date +%F), $threads threads, -p $nprompt -n $npred, one run each"
echo
echo "| target | draft layers | F | k | alpha | c | v | measured speed-up | predicted | efficiency | same tokens | accepted/drafted | llama.cpp accepted/drafted | llama.cpp speed-up |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
while IFS=$'\t' read -r name L F k a c v m p e s da lda lsp _; do
  [ "$m" = - ] || m=${m}x; [ "$p" = - ] || p=${p}x
  echo "| $name | $L | $F | $k | $a | $c | $v | $m | $p | $e | $s | $da | $lda | $lsp |"
done <"$rows"
echo
echo "alpha = accepted / (accepted + rejections); c = one draft step, v = verifying k+1 tokens, both"
echo "in target decode steps; predicted = ((1 - alpha^(k+1)) / (1 - alpha)) / (k c + v); efficiency ="
echo "measured / predicted. llama.cpp: its own prompt, so its acceptance differs; speed-up against"
echo "llama-bench tg$nllama on the same file just before and after (unsteady: those two differ by"
echo "over 25%, the machine's load changed). Prompt lookup drafts only where an n-gram matches, so"
echo "its predicted figure (drafts at every step) is an upper bound."
echo
echo "Draft cost split: c = shared + L x per-layer, a least-squares line through the mean c of each"
echo "draft size L (over every F and k; the targets of one type cost the same per step):"
echo
echo "| target | mean c by layers | c per layer | shared part (embeddings, head, overhead) | shared part of a 2-layer draft's cost | bytes: shared part of a 2-layer draft |"
echo "|---|---|---:|---:|---:|---:|"
awk -F'\t' '
  FILENAME == ARGV[1] { tm[$1] = $3; nl[$1] = $4; dl[$1] = $2; dm[$1] = $5; next }
  $6 != "-" && $2 ~ /^[0-9]+$/ { s[$1, $2] += $6; n[$1, $2]++; names[$1] = 1; if (!(($1, $2) in seen)) { seen[$1, $2] = 1; ls[$1] = ls[$1] " " $2 } }
  END {
    for (name in names) {
      m = split(ls[name], L, " "); if (m < 2) continue
      sl = sc = sll = slc = 0; txt = ""
      for (i = 1; i <= m; i++) {
        c = s[name, L[i]] / n[name, L[i]]; sl += L[i]; sc += c; sll += L[i] * L[i]; slc += L[i] * c
        txt = txt sprintf("%s%s: %.3f", i > 1 ? ", " : "", L[i], c)
      }
      per = (m * slc - sl * sc) / (m * sll - sl * sl); shared = (sc - per * sl) / m
      T = tm[name]; N = nl[name]; D = dm[name]; K = dl[name]
      H = (D - K * T / N) / (1 - K / N); D2 = H + 2 * (T - H) / N
      printf "| %s | %s | %.3f | %.3f | %.0f%% | %.0f of %.0f MiB (%.0f%%) |\n", name, txt, per, shared,
        100 * shared / (shared + 2 * per), H, D2, 100 * H / D2
    }
  }' "$sizes" "$rows" | sort
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); logs in $logs"
