// One model across several nodes (issue 7): `cairn node` processes on 127.0.0.1 joined
// with --peer and sealed by one cluster secret (so the data plane is encrypted), an instance placed with "sharding":"pipeline" and min_nodes 2 or 3, each
// rank a runner process holding a layer range, linked rank to rank by the data plane.
// Greedy answers equal those of a single-node instance of the same file, for a qwen2 and
// a llama model, mixtures of experts (qwen3moe; gpt-oss with its sinks, biases and sliding layers), gemma3
// (sliding-window layers) and phi3, alone and 8 at once, and with a draft model on rank 0. SIGKILL of the
// second rank's runner mid-stream: the client gets an error, the instance comes back, a
// new request succeeds. SIGKILL of a whole node mid-stream: an error, the node leaves the
// cluster, the instance is placed again on the nodes left and serves. No runner is left
// behind when the nodes stop.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, SHARED, QWEN_VOCAB, MOE_SHAPE, makeTempDir, removeTempDir, makeModel, startNode, runCairn, http, sleep, metric,
  assertStopsCleanly, getState, waitState, clusterPort, instanceReady, placeInstance, deleteInstance } from './cairn.mjs';

const QWEN = 'qwen-pipe';
const DRAFT = 'qwen-pipe-draft';
const LLAMA = 'llama-pipe';
const MOE = 'qwen3moe-pipe';
const GEMMA = 'gemma3-pipe';
const PHI = 'phi3-pipe';
const OSS = 'gpt-oss-pipe';
const MAX = 32;
const T = { timeout: 600_000 * SLOW };
const PROMPTS = ['Hello', 'Tell me about cats.', 'What is 2+2?', 'Why is the sky blue?', 'Name a colour.',
  'Count to five.', 'Write a haiku.', 'What is a pipeline?'];
let dir, nodes = [];

function client(node) {
  return new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOW });
}

async function complete(openai, model, prompt, extra = {}) {
  const r = await openai.completions.create({ model, prompt, max_tokens: MAX, temperature: 0, ignore_eos: true,
    ...extra });
  return { text: r.choices[0].text, usage: r.usage };
}

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  const target = await makeModel(models, QWEN);
  const d = await runCairn(['mkmodel', '--draft-of', target, '--layers', '2', '-o', path.join(models, `${DRAFT}.gguf`)]);
  assert.equal(d.code, 0, d.stderr);
  const l = await runCairn(['mkmodel', '--shape', 'tiny', '--vocab',
    path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-bpe.gguf'), '-o', path.join(models, `${LLAMA}.gguf`)]);
  assert.equal(l.code, 0, l.stderr);
  await makeModel(models, MOE, MOE_SHAPE);
  // gemma3's sliding-window layers (a window of 24 positions) split over the ranks, and phi3
  for (const [shape, name] of [['gemma3-tiny', GEMMA], ['phi3-tiny', PHI]]) {
    const g = await runCairn(['mkmodel', '--shape', shape, '--vocab',
      path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-spm.gguf'), '-o', path.join(models, `${name}.gguf`)]);
    assert.equal(g.code, 0, g.stderr);
  }
  // gpt-oss-tiny: 4 layers, 8 experts of which 4 per token, sliding and full layers alternating
  const o = await runCairn(['mkmodel', '--shape', 'gpt-oss-tiny', '--type', 'f16', '--vocab', QWEN_VOCAB, '-o',
    path.join(models, `${OSS}.gguf`)]);
  assert.equal(o.code, 0, o.stderr);
  const expect = [QWEN, DRAFT, LLAMA, MOE, GEMMA, PHI, OSS];
  // a node unheard for 4 s leaves the cluster (the test of a lost node waits for that)
  const secret = path.join(dir, 'cluster-secret');
  fs.writeFileSync(secret, 'pipeline-e2e-secret\n', { mode: 0o600 });
  const common = ['-t', '1', '--node-timeout', '4', '--cluster-secret-file', secret];
  const a = await startNode(dir, models, { name: 'a', parallel: 8, expectModels: expect, args: common });
  nodes.push(a);
  const peer = ['--peer', `127.0.0.1:${clusterPort(a)}`, ...common];
  nodes.push(await startNode(dir, models, { name: 'b', parallel: 8, expectModels: expect, args: peer }));
  nodes.push(await startNode(dir, models, { name: 'c', parallel: 8, expectModels: expect, args: peer }));
  await waitState(a, (s) => Object.keys(s.nodes).length === 3, 'three nodes in the cluster');
});

after(async () => {
  for (const n of nodes)
    await n?.stop();
  removeTempDir(dir);
});

// The greedy answers of a single-node instance, then of pipelined ones over 2 and 3 nodes.
for (const model of [QWEN, LLAMA, MOE, GEMMA, PHI, OSS]) {
  test(`${model}: pipelined greedy answers equal the single node's, alone and 8 at once`, T, async () => {
    const a = nodes[0];
    const openai = client(a);
    const one = await placeInstance(a, { model_id: model, min_nodes: 1 });
    assert.equal(one.inst.shards.length, 1);
    const want = [];
    for (const p of PROMPTS)
      want.push((await complete(openai, model, p)).text);
    assert.ok(new Set(want).size > 1, 'different prompts give different answers');
    await deleteInstance(a, one.id);

    for (const k of [2, 3]) {
      const { id, inst } = await placeInstance(a, { model_id: model, sharding: 'pipeline', min_nodes: k });
      assert.equal(inst.shards.length, k, JSON.stringify(inst));
      assert.equal(new Set(inst.shards.map((s) => s.node_id)).size, k, 'one rank per node');
      assert.equal(inst.shards[0].layer_begin, 0);
      for (let i = 1; i < k; i++)
        assert.equal(inst.shards[i].layer_begin, inst.shards[i - 1].layer_end, 'contiguous layer ranges');
      assert.equal((await complete(openai, model, PROMPTS[0])).text, want[0], `${k} ranks, alone`);
      const got = await Promise.all(PROMPTS.map((p) => complete(openai, model, p)));
      for (let i = 0; i < PROMPTS.length; i++)
        assert.equal(got[i].text, want[i], `${k} ranks, 8 at once, prompt ${i}`);
      // the same again: prompt prefixes now come from the cache on every rank
      const again = await Promise.all(PROMPTS.map((p) => complete(openai, model, p)));
      for (let i = 0; i < PROMPTS.length; i++)
        assert.equal(again[i].text, want[i], `${k} ranks, prefix reuse, prompt ${i}`);
      // the steps went around the ring (rank 0's figures in /metrics)
      assert.ok(await metric(a, `cairn_pipeline_steps_total{instance="${id}"}`) > 0, 'pipeline steps counted');
      assert.ok(await metric(a, `cairn_pipeline_wait_microseconds_total{instance="${id}"}`) > 0);
      // greedy tokens were sampled on the last rank: a few bytes each came back, no logits rows
      const sampled = await metric(a, `cairn_pipeline_rows_sampled_total{instance="${id}"}`);
      const bytes = await metric(a, `cairn_pipeline_result_bytes_total{instance="${id}"}`);
      assert.ok(sampled >= PROMPTS.length * 2 * MAX, `rows sampled on the last rank: ${sampled}`);
      assert.equal(await metric(a, `cairn_pipeline_rows_logits_total{instance="${id}"}`), 0, 'no logits rows');
      assert.ok(bytes > 0 && bytes / sampled < 256, `${bytes} bytes back for ${sampled} tokens`);
      // the cluster has a secret: what rank 0 sent went sealed (encrypted)
      const sealed = await metric(a, `cairn_pipeline_sealed_bytes_total{instance="${id}"}`);
      assert.ok(sealed > 0 && sealed <= await metric(a, `cairn_pipeline_bytes_total{instance="${id}"}`),
        `sealed bytes ${sealed}`);
      await deleteInstance(a, id);
    }
  });
}

test('with a quantized KV cache (q8_0 K, q4_0 V), pipelined answers equal the single node\'s with it', T, async () => {
  const a = nodes[0];
  const openai = client(a);
  const kv = { cache_type_k: 'q8_0', cache_type_v: 'q4_0' };
  const one = await placeInstance(a, { model_id: QWEN, min_nodes: 1, ...kv });
  assert.equal(one.inst.cache_type_k, 'q8_0');
  const want = await Promise.all(PROMPTS.map((p) => complete(openai, QWEN, p)));
  await deleteInstance(a, one.id);
  const { id, inst } = await placeInstance(a, { model_id: QWEN, sharding: 'pipeline', min_nodes: 2, ...kv });
  assert.equal(inst.shards.length, 2);
  assert.equal(inst.cache_type_v, 'q4_0');
  const got = await Promise.all(PROMPTS.map((p) => complete(openai, QWEN, p)));
  for (let i = 0; i < PROMPTS.length; i++)
    assert.equal(got[i].text, want[i].text, `2 ranks, q8_0/q4_0 KV, prompt ${i}`);
  await deleteInstance(a, id);
});

test('a draft model on rank 0 keeps the pipelined answers exact', T, async () => {
  const a = nodes[0];
  const openai = client(a);
  const plain = await placeInstance(a, { model_id: QWEN, sharding: 'pipeline', min_nodes: 2 });
  const want = await Promise.all(PROMPTS.slice(0, 4).map((p) => complete(openai, QWEN, p)));
  await deleteInstance(a, plain.id);
  const { id } = await placeInstance(a, { model_id: QWEN, sharding: 'pipeline', min_nodes: 2, draft_model: DRAFT,
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

// pid of the runner process of runner_id, among the children of the nodes.
function runnerPid(runnerId) {
  for (const n of nodes)
    for (const pid of n.runnerPidsNow())
      if (n.cmdline(pid).includes(runnerId))
        return pid;
  return 0;
}

test('SIGKILL of the second rank mid-stream: an error, then the instance serves again', T, async () => {
  const a = nodes[0];
  const openai = client(a);
  const { id, inst } = await placeInstance(a, { model_id: QWEN, sharding: 'pipeline', min_nodes: 2 });
  const victim = runnerPid(inst.shards[1].runner_id);
  assert.ok(victim > 0, 'the rank 1 runner process is found');
  const stream = await openai.completions.create({ model: QWEN, prompt: PROMPTS[1], max_tokens: 4000,
    temperature: 0, ignore_eos: true, stream: true });
  let chunks = 0, failed = null;
  const t0 = Date.now();
  try {
    for await (const c of stream) {
      chunks += c.choices.length;
      if (chunks === 3)
        process.kill(victim, 'SIGKILL');
    }
  } catch (e) {
    failed = e;
  }
  assert.ok(chunks >= 3, 'tokens flowed before the kill');
  assert.ok(failed, 'the stream ends with an error, not a normal finish');
  assert.ok(Date.now() - t0 < 60_000 * SLOW, 'the error came within bounds');
  // the instance (this one or its re-placement) serves again
  const s = await waitState(a, (st) => Object.keys(st.instances).some((i) => instanceReady(st, i)), 'an instance ready again');
  const again = Object.keys(s.instances).find((i) => instanceReady(s, i));
  assert.ok(again);
  const r = await complete(openai, QWEN, PROMPTS[0]);
  assert.equal(typeof r.text, 'string');
  assert.ok(r.usage.completion_tokens === MAX);
  await deleteInstance(a, again);
  if (again !== id)
    assert.equal((await getState(a)).instances[id], undefined);
});

test('a node that dies mid-stream: an error, its instance placed again on the nodes left', T, async () => {
  const a = nodes[0], c = nodes[2];
  const openai = client(a);
  const { id, inst } = await placeInstance(a, { model_id: QWEN, sharding: 'pipeline', min_nodes: 3 });
  const cId = (await (await fetch(`${c.url}/node_id`)).json()).node_id;
  assert.ok(inst.shards.some((sh) => sh.node_id === cId), 'node c holds a rank');
  const stream = await openai.completions.create({ model: QWEN, prompt: PROMPTS[2], max_tokens: 4000,
    temperature: 0, ignore_eos: true, stream: true });
  let chunks = 0, failed = null;
  const t0 = Date.now();
  try {
    for await (const ch of stream) {
      chunks += ch.choices.length;
      if (chunks === 3) {
        c.proc.kill('SIGKILL'); // the node; its runners follow it (their node pipe ends)
      }
    }
  } catch (e) {
    failed = e;
  }
  assert.ok(failed, 'the stream ends with an error');
  assert.ok(Date.now() - t0 < 60_000 * SLOW, 'within bounds');
  const s = await waitState(a, (st) => !st.nodes[cId] && !st.instances[id] &&
    Object.keys(st.instances).some((i) => st.instances[i].model_id === QWEN && instanceReady(st, i)),
  'the instance placed again without node c');
  const again = Object.keys(s.instances).find((i) => s.instances[i].model_id === QWEN);
  assert.ok(s.instances[again].shards.every((sh) => sh.node_id !== cId));
  const r = await complete(openai, QWEN, PROMPTS[0]);
  assert.equal(r.usage.completion_tokens, MAX);
  await deleteInstance(a, again);
  await c.stop();
});

test('the nodes left stop cleanly, leaving no runner behind', T, async () => {
  for (const n of nodes.slice(0, 2).reverse())
    await assertStopsCleanly(n);
});
