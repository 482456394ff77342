#!/usr/bin/env python3
"""RoPE scaling past a model's original context, cairn against llama.cpp (issue 21).

Greedy tokens of random-weight models fall into loops that hardly depend on positions,
so this compares what does: the next-token distribution after a long prompt. For each
file (F16 weights, made with `cairn mkmodel`): YaRN (factor 4 over 2048 positions, a
prompt of about 3,900 tokens) and Llama 3's rope_freqs (a prompt of about 9,000 tokens,
past its 8192), llama-server's /completion (n_probs) and a cairn node's /v1/completions
(logprobs) give the top 8 tokens and their log-probabilities. They must name the same
tokens, with log-probabilities within 2e-3. As a control, the same model without its
scaling must differ from llama.cpp's by more than that and 5x cairn's difference, so the
check sees the scaling. gpt-oss-tiny (F16, YaRN factor 32 over 128 positions, every other
layer sliding over 24, attention sinks; a prompt of about 1,500 tokens) is compared the same
way, its control the same shape with YaRN factor 2.

  usage: bench/agree_rope.py [CAIRN_BINARY]     (default build/cairn; llama.cpp from
         ../shared/tools/llama-ref.sh)
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB = os.path.join(ROOT, '..', 'shared', 'testdata', 'vocab')
DIMS = ['--n-embd', '256', '--n-layers', '4', '--n-head', '4', '--n-head-kv', '2', '--n-ff', '512',
        '--type', 'f16', '--seed', '5']
ARCH = lambda a: ['--arch', a, *DIMS]
CASES = [  # name, shape options, vocab, scaling options, control's options, README bytes of prompt
    ('yarn', ARCH('qwen2'), 'qwen2', ['--ctx', '8192', '--yarn', '4'], ['--ctx', '8192'], 14000),
    ('llama3', ARCH('llama'), 'llama-bpe', ['--ctx', '32768', '--llama3-rope'], ['--ctx', '32768'], 36000),
    # gpt-oss (sinks, biases, top-k softmax routing, clamped SwiGLU, sliding layers, YaRN
    # factor 32 over 128 positions): the control is the same shape with YaRN factor 2
    ('gpt-oss', ['--shape', 'gpt-oss-tiny', '--type', 'f16', '--seed', '5'], 'qwen2', [], ['--yarn', '2'], 6000),
]
TOP = 8
TOLERANCE = 2e-3


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_http(url, limit=120):
    t0 = time.time()
    while time.time() - t0 < limit:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.3)
    raise RuntimeError(f'{url} did not come up')


def llama_top(server, model, prompt):
    port = free_port()
    # Flash attention off: llama.cpp's CPU flash attention rounds q to F16 for Q.K, which
    # moves these log-probabilities by 1e-2 past ~2000 positions (measured 2026-12-05);
    # without it llama.cpp agrees with cairn within 2e-4 at 4,000 and 10,000 positions.
    p = subprocess.Popen([server, '-m', model, '--port', str(port), '-c', '16384', '-t', '2', '-np', '1', '-fa', 'off'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f'http://127.0.0.1:{port}/health')
        r = post(f'http://127.0.0.1:{port}/completion', {'prompt': prompt, 'n_predict': 1, 'n_probs': TOP,
                                                         'temperature': 0, 'cache_prompt': False})
        top = r['completion_probabilities'][0]['top_logprobs']
        return r['tokens_evaluated'], {t['token']: t['logprob'] for t in top}
    finally:
        p.terminate()
        p.wait()


def cairn_top(binary, model, prompt, work):
    models = os.path.join(work, 'models')
    shutil.rmtree(models, ignore_errors=True)
    os.makedirs(models)
    os.symlink(model, os.path.join(models, 'm.gguf'))
    port = free_port()
    data = tempfile.mkdtemp(dir=work)
    p = subprocess.Popen([binary, 'node', '--api-host', '127.0.0.1', '--api-port', str(port), '--bind', '127.0.0.1',
                          '--cluster-port', '0', '--discovery', 'off', '--models-dir', models, '--data-dir', data,
                          '-t', '2', '--log-file', os.path.join(work, 'node.log')],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f'http://127.0.0.1:{port}/node_id')
        r = post(f'http://127.0.0.1:{port}/v1/completions', {'model': 'm', 'prompt': prompt, 'max_tokens': 1,
                                                             'logprobs': TOP, 'temperature': 0})
        top = r['choices'][0]['logprobs']['top_logprobs'][0]
        return r['usage']['prompt_tokens'], top
    finally:
        p.terminate()
        p.wait()


def diff(a, b):
    """Largest |logprob difference| over the tokens both name; inf unless both put the same
    token first and share most of the rest (near-ties at the tail may swap)."""
    common = set(a) & set(b)
    if max(a, key=a.get) != max(b, key=b.get) or len(common) < TOP - 2:
        return float('inf')
    return max(abs(a[t] - b[t]) for t in common)


def main():
    binary = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, 'build', 'cairn'))
    ref = subprocess.run(['bash', os.path.join(ROOT, 'bench', 'llama_ref.sh')], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[-1]
    server = os.path.join(ref, 'llama-server')
    readme = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    fail = False
    with tempfile.TemporaryDirectory() as work:
        for name, shape, vocab, scaling, control_opts, nbytes in CASES:
            prompt = readme[:nbytes]
            files = {}
            for kind, extra in (('scaled', scaling), ('plain', control_opts)):
                files[kind] = os.path.join(work, f'{name}-{kind}.gguf')
                subprocess.run([binary, 'mkmodel', *shape, *extra, '--vocab',
                                os.path.join(VOCAB, f'ggml-vocab-{vocab}.gguf'), '-o', files[kind]], check=True,
                               capture_output=True)
            n_llama, theirs = llama_top(server, files['scaled'], prompt)
            n_ours, ours = cairn_top(binary, files['scaled'], prompt, work)
            _, plain = cairn_top(binary, files['plain'], prompt, work)
            d, control = diff(ours, theirs), diff(plain, theirs)
            ok = d <= TOLERANCE and control > max(TOLERANCE, 5 * d) and n_llama == n_ours
            fail |= not ok
            print(f"{'same  ' if ok else 'DIFFER'} {name}: prompt {n_ours} tokens (llama.cpp {n_llama}); "
                  f"top-{TOP} logprobs within {d:.2e} of llama.cpp's; without the scaling {control:.2e}")
    sys.exit(1 if fail else 0)


if __name__ == '__main__':
    main()
