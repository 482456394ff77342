#!/usr/bin/env python3
"""A mixed pipeline: an x86-64 `cairn node` and an ARM64 `cairn node` run by qemu-user,
linked over loopback (--peer 127.0.0.1:PORT, discovery off), must answer greedy prompts
with the same tokens as the x86-64 node alone.

usage: arm64_pipeline.py HOST_CAIRN ARM64_CAIRN QEMU VOCAB.gguf

1. Node A (x86-64) alone: a tiny llama made by `cairn mkmodel` is placed and answers
   N_PROMPTS greedy completions; the instance is deleted.
2. Node B (ARM64, under QEMU -cpu max, its runners too: CAIRN_RUNNER_WRAPPER) joins A.
3. A pipelined instance ("sharding": "pipeline", min_nodes 2) gets one rank per node and
   must give the same texts and token counts.
Every wait is bounded; the nodes are stopped and the folder removed at the end. Exits
non-zero on any failure (the node logs' tails are printed then)."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

N_PROMPTS = 3
MAX_TOKENS = 6
PROMPTS = ["hi", "The quick brown fox", "Once upon a time"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def http(port, method, path, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return -1, str(e)


def state(port):
    st, text = http(port, "GET", "/state", timeout=10)
    return json.loads(text) if st == 200 else {}


def wait(what, fn, limit_s):
    t0 = time.time()
    while time.time() - t0 < limit_s:
        v = fn()
        if v:
            print(f"  {what}: {time.time() - t0:.1f} s", flush=True)
            return v
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not within {limit_s} s")


class Node:
    def __init__(self, name, argv_prefix, binary, folder, peer=None, env=None):
        self.api, self.cluster = free_port(), free_port()
        self.log = os.path.join(folder, f"{name}.log")
        argv = argv_prefix + [binary, "node", "--api-port", str(self.api), "--cluster-port", str(self.cluster),
                              "--bind", "127.0.0.1", "--data-dir", os.path.join(folder, f"data-{name}"),
                              "--models-dir", os.path.join(folder, "models"), "--discovery", "off",
                              "--node-timeout", "300", "--memory-limit", "1G", "-t", "1", "-v"]
        if peer:
            argv += ["--peer", f"127.0.0.1:{peer.cluster}"]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, **(env or {})), start_new_session=True)
        self.name = name

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self):
        try:
            with open(self.log, errors="replace") as f:
                lines = f.readlines()[-30:]
        except OSError:
            lines = ["(no log)\n"]
        sys.stderr.write(f"---- {self.name}: {self.log} ----\n" + "".join(lines))


def place(port, body):
    st, text = http(port, "POST", "/place_instance", body, timeout=120)
    if st != 200:
        raise RuntimeError(f"place_instance {body}: {st} {text}")
    return json.loads(text)["instance_id"]


def ready_shards(port, iid):
    s = state(port)
    shards = s.get("instances", {}).get(iid, {}).get("shards", [])
    if not shards:
        return None
    runners = s.get("runners", {})
    for sh in shards:
        if runners.get(sh.get("runner_id"), {}).get("status") not in ("Ready", "Running"):
            return None
    return shards


def complete(port, prompt):
    body = {"model": "m1", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    st, text = http(port, "POST", "/v1/completions", body, timeout=600)
    if st != 200:
        raise RuntimeError(f"completion of {prompt!r}: {st} {text}")
    j = json.loads(text)
    return j["choices"][0]["text"], j["usage"]["completion_tokens"]


def main():
    host, arm, qemu, vocab = sys.argv[1:5]
    folder = tempfile.mkdtemp(prefix="cairn-arm64-pipe-")
    nodes = []
    ok = False
    try:
        os.makedirs(os.path.join(folder, "models"))
        subprocess.run([host, "mkmodel", "--shape", "tiny", "--vocab", vocab, "-o",
                        os.path.join(folder, "models", "m1.gguf")], check=True, stdout=subprocess.DEVNULL)
        a = Node("a-x86_64", [], host, folder)
        nodes.append(a)
        wait("node A's API", lambda: state(a.api).get("nodes"), 60)
        iid = place(a.api, {"model_id": "m1", "min_nodes": 1})
        wait("single-node instance ready", lambda: ready_shards(a.api, iid), 120)
        want = [complete(a.api, p) for p in PROMPTS[:N_PROMPTS]]
        for p, w in zip(PROMPTS, want):
            print(f"  x86-64 alone: {p!r} -> {w[0]!r} ({w[1]} tokens)")
        st, text = http(a.api, "DELETE", f"/instance/{iid}")
        if st != 200:
            raise RuntimeError(f"DELETE instance: {st} {text}")
        wait("single-node instance gone", lambda: iid not in state(a.api).get("instances", {}), 60)

        b = Node("b-arm64", [qemu, "-cpu", "max", "-L", "/"], arm, folder, peer=a,
                 env={"CAIRN_RUNNER_WRAPPER": f"{qemu} -cpu max -L /"})
        nodes.append(b)
        wait("node B (ARM64 under qemu) in A's state", lambda: len(state(a.api).get("nodes", {})) == 2, 300)
        iid = place(a.api, {"model_id": "m1", "sharding": "pipeline", "min_nodes": 2})
        shards = wait("pipelined instance ready", lambda: ready_shards(a.api, iid), 600)
        on = {sh.get("node_id") for sh in shards}
        if len(shards) != 2 or len(on) != 2:
            raise RuntimeError(f"want 2 shards on 2 nodes: {shards}")
        # each rank on its own architecture, as the node reports it (its uname and ISA)
        info = {nid: json.dumps(n) for nid, n in state(a.api).get("nodes", {}).items()}
        machines = []
        for k, sh in enumerate(shards):
            text = info.get(sh.get("node_id"), "")
            m = "aarch64" if "aarch64" in text else "x86_64" if "x86_64" in text else "?"
            machines.append(m)
            isa = "asimddp" if "asimddp" in text else "avx512f" if "avx512f" in text else "avx2" if "avx2" in text else ""
            print(f"  rank {k}: layers {sh.get('layer_begin')}..{sh.get('layer_end')} on {sh.get('node_id')} ({m} {isa})")
        if sorted(machines) != ["aarch64", "x86_64"]:
            raise RuntimeError(f"want one rank on x86_64 and one on aarch64: {machines}")
        got = [complete(a.api, p) for p in PROMPTS[:N_PROMPTS]]
        bad = 0
        for p, w, g in zip(PROMPTS, want, got):
            same = w == g
            bad += not same
            print(f"  pipeline x86-64 + ARM64: {p!r} -> {g[0]!r} ({g[1]} tokens) {'same' if same else 'DIFFERS'}")
        if bad:
            raise RuntimeError(f"{bad} of {N_PROMPTS} answers differ from the x86-64 node's")
        ok = True
        print("mixed pipeline: same greedy tokens as one x86-64 node")
    except Exception as e:  # noqa: BLE001 - any failure fails the run, with the logs
        sys.stderr.write(f"arm64_pipeline: FAILED: {e}\n")
        for n in nodes:
            n.tail()
    finally:
        for n in reversed(nodes):
            n.stop()
        if ok and not os.environ.get("CAIRN_TEST_KEEP"):
            shutil.rmtree(folder, ignore_errors=True)
        elif not ok:
            sys.stderr.write(f"kept {folder}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
