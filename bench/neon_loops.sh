#!/usr/bin/env bash
# Instructions in the innermost loop of each NEON kernel, from the disassembly of -O3
# builds of src/kern/mat_neoni8mm.c, mat_neondot.c and mat_neon.c (README, "ARM64"): the
# smallest loop that holds a dot instruction (smmla: the loop over 2 activation rows of
# the i8mm path; sdot and smull: 1 activation row; fmla for the float types). Needs gcc-aarch64-linux-gnu and a configured build-arm64/ (for its include view).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in mat_neoni8mm mat_neondot mat_neon; do
  arch=""; [ $f = mat_neondot ] && arch=-march=armv8.2-a+dotprod
  [ $f = mat_neoni8mm ] && arch=-march=armv8.2-a+dotprod+i8mm
  aarch64-linux-gnu-gcc -O3 -std=gnu17 -ffp-contract=off -fno-math-errno $arch \
    -Ibuild-arm64/view/kern -c src/kern/$f.c -o "$tmp/$f.o"
  aarch64-linux-gnu-objdump -d --no-show-raw-insn "$tmp/$f.o" > "$tmp/$f.dis"
done
python3 - "$tmp" <<'PY'
import re, sys
def parse(path):
    func, insns = None, {}
    for l in open(path):
        m = re.match(r'^([0-9a-f]+) <([\w.]+)>:', l)
        if m:
            func = m.group(2); insns[func] = []; continue
        m = re.match(r'^\s+([0-9a-f]+):\s+(\S+)\s*(.*)', l)
        if m and func:
            insns[func].append((int(m.group(1), 16), m.group(2), m.group(3)))
    return insns
def loops(ins):  # bodies of backward branches
    for a, op, arg in ins:
        if op.startswith('b.') or op in ('b', 'cbnz', 'cbz', 'tbnz', 'tbz'):
            m = re.search(r'([0-9a-f]+) <', arg)
            if m and int(m.group(1), 16) < a:
                t = int(m.group(1), 16)
                yield [x for x in ins if t <= x[0] <= a]
for name, key in (('mat_neoni8mm', 'smmla'), ('mat_neondot', 'sdot'), ('mat_neon', 'smull')):
    ins = parse(f'{sys.argv[1]}/{name}.dis')
    run = 'kern_' + name + '_run'
    for f in ('q4_0', 'q4_1', 'q5_0', 'q5_1', 'q8_0', 'q4_k', 'q5_k', 'q6_k', run, 'q2_k', 'q3_k',
              'iq4_nl', 'iq4_xs', 'mxfp4', 'f32', 'f16', 'bf16'):
        if f not in ins:
            continue
        if key == 'smmla' and f in ('f32', 'f16', 'bf16'):
            continue
        k = 'fmla' if f in ('f32', 'f16', 'bf16') else key
        ls = [l for l in loops(ins[f]) if any(x[1] == k for x in l)]
        if not ls:
            continue
        l = min(ls, key=len)
        print(f"{name:12s} {'q6_k' if f == run else f:5s} {len(l):4d} instructions, {sum(x[1] == k for x in l):2d} {k}")
PY
