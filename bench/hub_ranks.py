#!/usr/bin/env python3
"""Bytes a pipeline rank fetches from the hub (`cairn pull --layers A:B`, as a node does
when a placement gives it those layers) against the whole file, from a fake hub on
loopback (bench/hub_serve.mjs): for each model shape and each count of ranks, layers
split evenly, the bytes each rank's layers read and the hub's bytes sent for it.
Usage: python3 bench/hub_ranks.py [RANKS=2,4] [SHAPE ...]
SHAPE: a mkmodel shape name with optional extra flags after a colon, e.g.
'llama-1b' (tied head) or 'llama-8b:--n-layers 8' (untied head; fewer layers)."""
import os, shutil, subprocess, sys, tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cairn = os.environ.get("CAIRN_BINARY", os.path.join(root, "build", "cairn"))
vocab = os.path.join(root, "..", "shared", "testdata", "vocab", "ggml-vocab-llama-bpe.gguf")
ranks = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "2,4").split(",")]
shapes = sys.argv[2:] or ["llama-1b", "llama-8b:--n-layers 8"]


def n_layers(shape):
    extra = shape.split(":", 1)[1].split() if ":" in shape else []
    if "--n-layers" in extra:
        return int(extra[extra.index("--n-layers") + 1])
    return {"llama-1b": 16, "llama-8b": 32, "qwen-0.5b": 24, "qwen3-0.6b": 28}[shape.split(":")[0]]


tmp = tempfile.mkdtemp(prefix="cairn-bench-ranks-")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu} (bytes do not depend on it)")
print("| model (Q4_K_M) | file | ranks | bytes per rank (share of the file) | hub sent per rank |\n|---|---:|---:|---|---|")
try:
    for shape in shapes:
        name, extra = (shape.split(":", 1) + [""])[:2]
        path = os.path.join(tmp, "m.gguf")
        subprocess.run([cairn, "mkmodel", "--shape", name, *extra.split(), "--type", "q4_k_m", "--vocab", vocab,
                        "-o", path], check=True, stdout=subprocess.DEVNULL)
        size = os.path.getsize(path)
        hub = subprocess.Popen(["node", os.path.join(root, "bench", "hub_serve.mjs"), path],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        url = hub.stdout.readline().strip()
        env = dict(os.environ, HF_ENDPOINT=url, HF_TOKEN="", HF_HUB_OFFLINE="")
        L = n_layers(shape)
        for n in ranks:
            shares, sent = [], []
            for r in range(n):
                a, b = r * L // n, (r + 1) * L // n
                d = os.path.join(tmp, f"models-{n}-{r}")
                hub.stdin.write("bytes\n"); hub.stdin.flush()
                before = int(hub.stdout.readline())
                out = subprocess.run([cairn, "pull", "bench-org/Big-GGUF:Q8_0", "--layers", f"{a}:{b}",
                                      "--models-dir", d], env=env, check=True, capture_output=True, text=True)
                hub.stdin.write("bytes\n"); hub.stdin.flush()
                sent.append(int(hub.stdout.readline()) - before)
                line = [l for l in out.stderr.splitlines() if "bytes read by them" in l][0]
                shares.append(int(line.split("layers ")[1].split(": ")[1].split(" bytes")[0]))
                shutil.rmtree(d, ignore_errors=True)
            fmt = ", ".join(f"{s / 2**20:.0f} MiB ({s / size:.2f})" for s in shares)
            print(f"| {shape} | {size / 2**20:.0f} MiB | {n} | {fmt} | "
                  f"{', '.join(f'{s / 2**20:.0f} MiB' for s in sent)} |", flush=True)
        hub.stdin.close()
        hub.wait()
        os.unlink(path)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
