// Tensor parallelism (issue 22): two `cairn node` processes on 127.0.0.1 joined with --peer
// and sealed by one cluster secret, an instance placed with "sharding":"tensor" over both:
// each rank a runner process holding only its rows of every matrix and computing its half of every layer
// (its KV heads, its rows of every matrix), the halves exchanged over the data plane.
// Greedy answers and their log-probabilities equal those of a single-node instance of the
// same file, bit for bit, alone and 8 at once, and with a draft model on rank 0. SIGKILL
// of rank 1's runner mid-stream: the client gets an error within seconds, the instance
// comes back and answers again.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, runCairn, http, getState, waitState, clusterPort,
  instanceReady, placeInstance, deleteInstance, assertStopsCleanly } from './cairn.mjs';

const QWEN = 'qwen-tp';
const DRAFT = 'qwen-tp-draft';
const MAX = 24;
const T = { timeout: 600_000 * SLOW };
const PROMPTS = ['Hello', 'Tell me about cats.', 'What is 2+2?', 'Why is the sky blue?', 'Name a colour.',
  'Count to five.', 'Write a haiku.', 'What is a tensor?'];
let dir, nodes = [];

function client(node) {
  return new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOW });
}

// The greedy text, its tokens' log-probabilities and usage.
async function complete(openai, model, prompt, extra = {}) {
  const r = await openai.completions.create({ model, prompt, max_tokens: MAX, temperature: 0, ignore_eos: true,
    logprobs: 2, ...extra });
  const lp = r.choices[0].logprobs;
  return { text: r.choices[0].text, lp: JSON.stringify([lp.tokens, lp.token_logprobs, lp.top_logprobs]),
    usage: r.usage };
}

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  const target = await makeModel(models, QWEN);
  const d = await runCairn(['mkmodel', '--draft-of', target, '--layers', '2', '-o', path.join(models, `${DRAFT}.gguf`)]);
  assert.equal(d.code, 0, d.stderr);
  const expect = [QWEN, DRAFT];
  const secret = path.join(dir, 'cluster-secret');
  fs.writeFileSync(secret, 'tensor-e2e-secret\n', { mode: 0o600 });
  const common = ['-t', '1', '--node-timeout', '4', '--cluster-secret-file', secret];
  const a = await startNode(dir, models, { name: 'a', parallel: 8, expectModels: expect, args: common });
  nodes.push(a);
  const peer = ['--peer', `127.0.0.1:${clusterPort(a)}`, ...common];
  nodes.push(await startNode(dir, models, { name: 'b', parallel: 8, expectModels: expect, args: peer }));
  await waitState(a, (s) => Object.keys(s.nodes).length === 2, 'two nodes in the cluster');
});

after(async () => {
  for (const n of nodes)
    await n?.stop();
  removeTempDir(dir);
});

test('the previews offer a tensor placement over two nodes that runs', T, async () => {
  const a = nodes[0];
  const r = await http(`${a.url}/instance/previews?model_id=${QWEN}&sharding=tensor&min_nodes=2`, { method: 'GET' });
  assert.equal(r.status, 200, r.text);
  const two = r.json.candidates.filter((c) => c.shares.length === 2);
  assert.ok(two.length > 0, r.text);
  assert.ok(two.every((c) => c.accepted && c.executable === true), r.text);
  assert.ok(two[0].shares.every((s) => s.layer_begin === 0), 'every rank holds every layer');
});

test('tensor-parallel greedy answers and log-probabilities equal the single node\'s, alone and 8 at once', T, async () => {
  const a = nodes[0];
  const openai = client(a);
  const one = await placeInstance(a, { model_id: QWEN, min_nodes: 1 });
  assert.equal(one.inst.shards.length, 1);
  const want = [];
  for (const p of PROMPTS)
    want.push(await complete(openai, QWEN, p));
  assert.ok(new Set(want.map((w) => w.text)).size > 1, 'different prompts give different answers');
  await deleteInstance(a, one.id);

  const { id, inst } = await placeInstance(a, { model_id: QWEN, sharding: 'tensor', min_nodes: 2 });
  assert.equal(inst.sharding, 'tensor');
  assert.equal(inst.shards.length, 2, JSON.stringify(inst));
  assert.equal(new Set(inst.shards.map((s) => s.node_id)).size, 2, 'one rank per node');
  for (const s of inst.shards)
    assert.equal(s.layer_begin, 0, 'every rank holds every layer');
  const alone = await complete(openai, QWEN, PROMPTS[0]);
  assert.equal(alone.text, want[0].text, 'alone: text');
  assert.equal(alone.lp, want[0].lp, 'alone: log-probabilities');
  for (const round of ['8 at once', 'prefix reuse']) {
    const got = await Promise.all(PROMPTS.map((p) => complete(openai, QWEN, p)));
    for (let i = 0; i < PROMPTS.length; i++) {
      assert.equal(got[i].text, want[i].text, `${round}, prompt ${i}: text`);
      assert.equal(got[i].lp, want[i].lp, `${round}, prompt ${i}: log-probabilities`);
    }
  }
  await deleteInstance(a, id);
});

test('a draft model on rank 0 keeps the tensor-parallel answers exact', T, async () => {
  const a = nodes[0];
  const openai = client(a);
  const one = await placeInstance(a, { model_id: QWEN, min_nodes: 1 });
  const want = await Promise.all(PROMPTS.slice(0, 4).map((p) => complete(openai, QWEN, p)));
  await deleteInstance(a, one.id);
  const { id } = await placeInstance(a, { model_id: QWEN, sharding: 'tensor', min_nodes: 2, draft_model: DRAFT,
    num_draft_tokens: 4 });
  const got = await Promise.all(PROMPTS.slice(0, 4).map((p) => complete(openai, QWEN, p)));
  let drafted = 0;
  for (let i = 0; i < 4; i++) {
    assert.equal(got[i].text, want[i].text, `prompt ${i} with a draft`);
    drafted += got[i].usage.draft_tokens ?? 0;
  }
  assert.ok(drafted > 0, 'the draft proposed tokens');
  await deleteInstance(a, id);
});

function runnerPid(runnerId) {
  for (const n of nodes)
    for (const pid of n.runnerPidsNow())
      if (n.cmdline(pid).includes(runnerId))
        return pid;
  return 0;
}

test('SIGKILL of rank 1 mid-stream: an error within seconds, then the instance serves again', T, async () => {
  const a = nodes[0];
  const openai = client(a);
  const { id, inst } = await placeInstance(a, { model_id: QWEN, sharding: 'tensor', min_nodes: 2 });
  const victim = runnerPid(inst.shards[1].runner_id);
  assert.ok(victim > 0, 'the rank 1 runner process is found');
  const stream = await openai.completions.create({ model: QWEN, prompt: PROMPTS[1], max_tokens: 4000,
    temperature: 0, ignore_eos: true, stream: true });
  let chunks = 0, failed = null, killedAt = 0;
  try {
    for await (const c of stream) {
      chunks += c.choices.length;
      if (chunks === 3) {
        process.kill(victim, 'SIGKILL');
        killedAt = Date.now();
      }
    }
  } catch (e) {
    failed = e;
  }
  assert.ok(chunks >= 3, 'tokens flowed before the kill');
  assert.ok(failed, 'the stream ends with an error, not a normal finish');
  assert.ok(Date.now() - killedAt < 10_000 * SLOW, `the error came ${Date.now() - killedAt} ms after the kill`);
  const s = await waitState(a, (st) => Object.keys(st.instances).some((i) => instanceReady(st, i)), 'an instance ready again');
  const again = Object.keys(s.instances).find((i) => instanceReady(s, i));
  assert.equal(s.instances[again].sharding, 'tensor');
  const r = await complete(openai, QWEN, PROMPTS[0]);
  assert.equal(r.usage.completion_tokens, MAX);
  await deleteInstance(a, again);
  if (again !== id)
    assert.equal((await getState(a)).instances[id], undefined);
});

test('the nodes stop cleanly, leaving no runner behind', T, async () => {
  for (const n of nodes.slice().reverse())
    await assertStopsCleanly(n);
});
