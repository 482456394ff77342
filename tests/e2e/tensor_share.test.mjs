// Tensor parallelism holds a model no node could alone (issue 22): each rank loads only its
// rows of every matrix, and placement counts only that. A probe node without a limit gives
// the one-node answers and the one-node need of the model; then two `cairn node`s (loopback,
// discovery off, --peer) each get a --memory-limit of 70% of that need: no single node fits
// the model, a placement with "sharding":"tensor" (min_nodes 1) takes both, and its greedy
// tokens and log-probabilities equal the one node's. Each rank's runner reports the weight
// bytes it holds: between them the ranks hold the one runner's matrices once (plus their
// norms each), each about half; and its VmRSS stays under the one runner's.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, SANITIZED, makeTempDir, removeTempDir, makeModel, startNode, http, waitState, clusterPort, placeInstance,
  deleteInstance } from './cairn.mjs';

const MODEL = 'qwen-share';
const MAX = 16;
// Weights that outweigh the rest of a runner (the vocabulary's tied embedding and 8 layers): ~110 MB in Q8_0.
const SHAPE = ['--arch', 'qwen2', '--n-embd', '512', '--n-layers', '8', '--n-head', '8', '--n-head-kv', '2',
  '--n-ff', '2048', '--seed', '7'];
const T = { timeout: 600_000 * SLOW };
const PROMPTS = ['Hello', 'Tell me about cats.', 'What is 2+2?'];
let dir, models, secret, nodes = [];

async function complete(node, prompt) {
  const openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOW });
  const r = await openai.completions.create({ model: MODEL, prompt, max_tokens: MAX, temperature: 0, ignore_eos: true,
    logprobs: 2 });
  const lp = r.choices[0].logprobs;
  return { text: r.choices[0].text, lp: JSON.stringify([lp.tokens, lp.token_logprobs, lp.top_logprobs]) };
}

// VmRSS and RssAnon (the repacked weights, the cache, the buffers) of a process, KiB.
function rssKiB(pid) {
  const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (key) => Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(st)?.[1] ?? 0);
  return { rss: kib('VmRSS'), anon: kib('RssAnon') };
}

before(async () => {
  dir = makeTempDir();
  models = path.join(dir, 'models');
  await makeModel(models, MODEL, SHAPE);
  secret = path.join(dir, 'cluster-secret');
  fs.writeFileSync(secret, 'tensor-share-secret\n', { mode: 0o600 });
});

after(async () => {
  for (const n of nodes)
    await n?.stop();
  removeTempDir(dir);
});

test('two nodes that cannot hold the model alone run it tensor-parallel, each holding its half', T, async () => {
  const common = ['-t', '1', '--node-timeout', '4', '--cluster-secret-file', secret];
  // The probe: one node, no limit: the reference answers, the one-node need, its runner's bytes.
  const probe = await startNode(dir, models, { name: 'probe', parallel: 2, expectModels: [MODEL], args: common });
  nodes.push(probe);
  await waitState(probe, (s) => Object.keys(s.nodes).length === 1, 'the probe in its cluster');
  const pv = await http(`${probe.url}/instance/previews?model_id=${MODEL}&sharding=tensor&min_nodes=1`,
    { method: 'GET' });
  assert.equal(pv.status, 200, pv.text);
  const whole = pv.json.candidates.find((c) => c.shares.length === 1 && c.accepted);
  assert.ok(whole, pv.text);
  const wholeNeed = whole.shares[0].need.total;
  assert.ok(wholeNeed > 0, JSON.stringify(whole.shares[0]));
  const one = await placeInstance(probe, { model_id: MODEL, min_nodes: 1 });
  const want = [];
  for (const p of PROMPTS)
    want.push(await complete(probe, p));
  const oneRunner = probe.runnerPidsNow();
  assert.equal(oneRunner.length, 1);
  const oneMem = rssKiB(oneRunner[0]);
  const card = (await http(`${probe.url}/models`, { method: 'GET' })).json;
  const weightBytes = card.models.find((c) => c.id === MODEL)?.weight_bytes;
  assert.ok(weightBytes > 0, JSON.stringify(card));
  await deleteInstance(probe, one.id);
  await probe.stop();
  nodes = [];

  // Two nodes with 70% of the one-node need each.
  const limit = String(Math.floor(wholeNeed * 0.7));
  const a = await startNode(dir, models, { name: 'a', parallel: 2, expectModels: [MODEL],
    args: [...common, '--memory-limit', limit] });
  nodes.push(a);
  const b = await startNode(dir, models, { name: 'b', parallel: 2, expectModels: [MODEL],
    args: ['--peer', `127.0.0.1:${clusterPort(a)}`, ...common, '--memory-limit', limit] });
  nodes.push(b);
  await waitState(a, (s) => Object.keys(s.nodes).length === 2, 'two nodes in the cluster');

  const r = await http(`${a.url}/instance/previews?model_id=${MODEL}&sharding=tensor&min_nodes=1`, { method: 'GET' });
  assert.equal(r.status, 200, r.text);
  assert.ok(r.json.candidates.filter((c) => c.shares.length === 1).every((c) => !c.accepted), 'no node holds it alone');
  const two = r.json.candidates.filter((c) => c.shares.length === 2 && c.accepted);
  assert.ok(two.length > 0 && two.every((c) => c.executable === true), r.text);
  const pr = await http(`${a.url}/instance/previews?model_id=${MODEL}&min_nodes=1`, { method: 'GET' });
  assert.ok(pr.json.candidates.filter((c) => c.shares.length === 1).every((c) => !c.accepted),
    'no one-node pipeline either');

  const { id, inst } = await placeInstance(a, { model_id: MODEL, sharding: 'tensor', min_nodes: 1 });
  assert.equal(inst.sharding, 'tensor');
  assert.equal(inst.shards.length, 2, JSON.stringify(inst));
  const got = await Promise.all(PROMPTS.map((p) => complete(a, p)));
  for (let i = 0; i < PROMPTS.length; i++) {
    assert.equal(got[i].text, want[i].text, `prompt ${i}: text`);
    assert.equal(got[i].lp, want[i].lp, `prompt ${i}: log-probabilities`);
  }

  // What each rank holds: its rows of every matrix (half), the norms whole: each runner's
  // anonymous memory (where the repacked weights live) is under the one runner's by more
  // than 40% of the model's weight bytes.
  const mem = [...a.runnerPidsNow(), ...b.runnerPidsNow()].map(rssKiB);
  assert.equal(mem.length, 2);
  console.log(`weights ${weightBytes} bytes; one runner: VmRSS ${oneMem.rss} KiB, RssAnon ${oneMem.anon} KiB; ` +
    `ranks: VmRSS ${mem.map((m) => m.rss).join(', ')} KiB, RssAnon ${mem.map((m) => m.anon).join(', ')} KiB; ` +
    `limit ${limit} bytes`);
  // (An ASan build keeps freed memory in its quarantine and adds shadow memory: its RSS
  // says little about what the weights take.)
  for (const m of SANITIZED ? [] : mem)
    assert.ok((oneMem.anon - m.anon) * 1024 > 0.4 * weightBytes, `a rank's RssAnon ${m.anon} KiB, one runner's ` +
      `${oneMem.anon} KiB, weights ${weightBytes} bytes`);
  await deleteInstance(a, id);
});
