// The context of a placed instance (issue 21): by default the model's trained context
// where memory allows it, else the largest that fits (halving, down to 4096); a context
// and KV cache types asked for are kept, counted by placement and used by the runner;
// a node's --ctx-size / -ctk / -ctv apply to the placements made through it; bad values
// are refused with the field named. A small qwen2 model trained (per its metadata) for
// 32768 positions.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, http, waitState, placeInstance,
  deleteInstance } from './cairn.mjs';

const MODEL = 'long-ctx';
const T = { timeout: 600_000 * SLOW };
let dir, models, nodes = [];

before(async () => {
  dir = makeTempDir();
  models = path.join(dir, 'models');
  await makeModel(models, MODEL, undefined, ['--ctx', '32768']);
});

after(async () => {
  for (const n of nodes)
    await n?.stop();
  removeTempDir(dir);
});

async function previews(node, query = '') {
  const r = await http(`${node.url}/instance/previews?model_id=${MODEL}${query}`, { method: 'GET' });
  return r;
}

function client(node) {
  return new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOW });
}

// A prompt of about n tokens of the qwen2 vocabulary.
const longPrompt = (n) => 'cat '.repeat(n);

let unlimited;

test('the trained context by default: a prompt past 4096 tokens is served', T, async () => {
  unlimited = await startNode(dir, models, { name: 'unlimited', parallel: 2, expectModels: [MODEL], args: ['-t', '1'] });
  nodes.push(unlimited);
  await waitState(unlimited, (s) => Object.values(s.nodes).some((nd) => nd.info.memory_available_bytes > 0), 'node info');
  const p = await previews(unlimited);
  assert.equal(p.status, 200, p.text);
  assert.equal(p.json.ctx_len, 32768, 'previews count the trained context');
  const { id, inst } = await placeInstance(unlimited, { model_id: MODEL });
  assert.equal(inst.ctx_len, 32768);
  assert.equal(inst.cache_type_k, undefined, 'f16 is the default and left out');
  const r = await client(unlimited).completions.create({ model: MODEL, prompt: longPrompt(6000), max_tokens: 4,
    temperature: 0, ignore_eos: true });
  assert.ok(r.usage.prompt_tokens > 4096, `prompt of ${r.usage.prompt_tokens} tokens`);
  assert.equal(r.usage.completion_tokens, 4);
  await deleteInstance(unlimited, id);
});

test('a context and KV types asked for are kept and used', T, async () => {
  const { id, inst } = await placeInstance(unlimited, { model_id: MODEL, ctx_len: 2048, cache_type_k: 'q8_0',
    cache_type_v: 'Q4_0' });
  assert.equal(inst.ctx_len, 2048);
  assert.equal(inst.cache_type_k, 'q8_0');
  assert.equal(inst.cache_type_v, 'q4_0', 'types are normalised');
  const openai = client(unlimited);
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hello' }],
    max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 8, 'a q8_0/q4_0 KV cache serves');
  // the runner holds 2048 positions a sequence now
  await assert.rejects(openai.completions.create({ model: MODEL, prompt: longPrompt(3000), max_tokens: 4 }),
    (e) => { assert.equal(e.status, 413, e.message); assert.match(e.message, /the context holds 2048/); return true; });
  await deleteInstance(unlimited, id);
});

test('bad contexts and types are refused with the field named', T, async () => {
  for (const [body, field] of [[{ ctx_len: 0 }, 'ctx_len'], [{ ctx_len: 'x' }, 'ctx_len'],
    [{ cache_type_k: 'q5_1' }, 'cache_type_k'], [{ cache_type_v: 7 }, 'cache_type_v']]) {
    const r = await http(`${unlimited.url}/place_instance`, { body: { model_id: MODEL, ...body } });
    assert.equal(r.status, 400, r.text);
    assert.match(r.text, new RegExp(field));
  }
  const r = await http(`${unlimited.url}/place_instance`, { body: { model_id: MODEL, ctx_len: 65536 } });
  assert.equal(r.status, 400, r.text);
  assert.match(r.text, /beyond .*32768/);
  const q = await previews(unlimited, '&cache_type_k=q3_k');
  assert.equal(q.status, 400, q.text);
  assert.match(q.text, /cache_type_k/);
});

test('where memory is short: the largest context that fits, and a refusal that says what the KV needs', T, async () => {
  const full = (await previews(unlimited, '&ctx_len=32768')).json;
  const least = (await previews(unlimited, '&ctx_len=4096')).json;
  const need = (p) => p.candidates[p.best].shares[0].need.total;
  const a = need(full), b = need(least);
  assert.ok(a > b, `the KV makes the difference: ${a} vs ${b}`);
  const limit = Math.floor((a + b) / 2);
  const short = await startNode(dir, models, { name: 'short', expectModels: [MODEL],
    args: ['-t', '1', '--memory-limit', String(limit)] });
  nodes.push(short);
  await waitState(short, (s) => Object.values(s.nodes).some((nd) => nd.info.memory_available_bytes > 0), 'node info');
  const p = await previews(short);
  assert.equal(p.status, 200, p.text);
  assert.ok(p.json.ctx_len >= 4096 && p.json.ctx_len < 32768, `a smaller context fits: ${p.json.ctx_len}`);
  const r = await http(`${short.url}/place_instance`, { body: { model_id: MODEL, ctx_len: 32768 } });
  assert.equal(r.status, 409, r.text);
  assert.match(r.text, /32768 positions holds [\d.]+ GiB of KV cache/);
  // q8_0 K and V hold about half: the whole context fits then
  const { inst } = await placeInstance(short, { model_id: MODEL, ctx_len: 32768, cache_type_k: 'q8_0',
    cache_type_v: 'q8_0' });
  assert.equal(inst.ctx_len, 32768);
  await short.stop();
  nodes.pop();
});

test("a node's --ctx-size and -ctk apply to the placements asked through it", T, async () => {
  const n = await startNode(dir, models, { name: 'flags', expectModels: [MODEL],
    args: ['-t', '1', '--ctx-size', '1024', '-ctk', 'q4_0'] });
  nodes.push(n);
  const r = await client(n).chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 2, temperature: 0, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 2);
  const s = await waitState(n, (st) => Object.keys(st.instances).length === 1, 'the instance placed on demand');
  const inst = Object.values(s.instances)[0];
  assert.equal(inst.ctx_len, 1024);
  assert.equal(inst.cache_type_k, 'q4_0');
  assert.equal(inst.cache_type_v, undefined);
});
