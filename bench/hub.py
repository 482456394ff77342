#!/usr/bin/env python3
"""cairn pull against curl on the same file from the same fake hub over loopback
(bench/hub_serve.mjs), alternating, with and without a per-connection throttle (as a
CDN limits each connection): wall time of cairn's default (4 connections for a file of
64 MiB or more) and of --connections 1, curl's, the ratio, and cairn's CPU time per GiB
(SHA-256 of every byte).
Usage: python3 bench/hub.py [SIZE_MIB=1024] [RUNS=3] [THROTTLE_MIB_S=200]"""
import os, resource, shutil, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cairn = os.environ.get("CAIRN_BINARY", os.path.join(root, "build", "cairn"))
size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
throttle = int(sys.argv[3]) if len(sys.argv) > 3 else 200


def timed(cmd, env):
    """Wall seconds and the children's CPU seconds of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench(limit):
    hub = subprocess.Popen(["node", os.path.join(root, "bench", "hub_serve.mjs"), str(size), str(limit)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    url = hub.stdout.readline().strip()
    env = dict(os.environ, HF_ENDPOINT=url, HF_TOKEN="", HF_HUB_OFFLINE="")
    res = {"cairn": [], "one": [], "curl": [], "cpu": []}
    tmp = tempfile.mkdtemp(prefix="cairn-bench-hub-")
    try:
        for _ in range(runs):
            d = os.path.join(tmp, "models")
            shutil.rmtree(d, ignore_errors=True)
            wall, cpu = timed([cairn, "pull", "bench-org/Big-GGUF:Q8_0", "--models-dir", d], env)
            res["cairn"].append(wall)
            res["cpu"].append(cpu)
            shutil.rmtree(d, ignore_errors=True)
            wall, _ = timed([cairn, "pull", "bench-org/Big-GGUF:Q8_0", "--models-dir", d, "--connections", "1"], env)
            res["one"].append(wall)
            out = os.path.join(tmp, "curl.out")
            wall, _ = timed(["curl", "-sfL", "-o", out, f"{url}/bench-org/Big-GGUF/resolve/main/Big-Q8_0.gguf"], env)
            res["curl"].append(wall)
            os.unlink(out)
    finally:
        hub.stdin.close()
        hub.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    label = f"throttled to {limit} MiB/s" if limit else "unthrottled"
    print(f"| {size} MiB, {label} | {med(res['cairn']):.2f} | {med(res['one']):.2f} | {med(res['curl']):.2f} | "
          f"{med(res['cairn']) / med(res['curl']):.2f} | {med(res['cpu']) / (size / 1024):.2f} |")


cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu}; {runs} runs each, alternating; medians")
print("| file | cairn pull (s) | cairn --connections 1 (s) | curl -L (s) | cairn / curl | cairn CPU s per GiB |\n"
      "|---|---:|---:|---:|---:|---:|")
bench(0)
bench(throttle)
