// A mixture-of-experts model (qwen3moe, 8 experts, 2 per token) served by a node: the
// greedy answer to a prompt is the same alone, among 7 other concurrent requests (started
// together, or staggered so that prefills join running decodes: the batch groups tokens
// by expert), and from `cairn generate`; with a dense draft of the same vocabulary
// (qwen2), speculative decoding gives exactly the plain answers and counts its drafted
// tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, MOE_SHAPE, makeTempDir, removeTempDir, makeModel, startNode, runCairn, http, metric, sleep,
  assertStopsCleanly } from './cairn.mjs';

const MODEL = 'qwen3moe-small';
const DRAFT = 'qwen-dense-draft';
const MAX = 24;
const T = { timeout: 300_000 * SLOW };
const PROMPTS = ['Hello', 'Tell me about cats.', 'What is 2+2?', 'Zebra', 'Why is the sky blue?',
  'List three colors', 'Write a haiku about rain.', 'Bonjour, comment allez-vous ?'];
let dir, modelPath, node, openai, instance;
const alone = [];

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  modelPath = await makeModel(models, MODEL, MOE_SHAPE);
  await makeModel(models, DRAFT); // the dense qwen2 shape: another architecture, the same vocabulary
  node = await startNode(dir, models, { parallel: 8, expectModels: [MODEL, DRAFT] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
  const r = await http(`${node.url}/place_instance`, { body: { model_id: MODEL } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  instance = r.json.instance_id;
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

// A streamed greedy completion of exactly MAX tokens: its text and final usage.
async function complete(prompt, extra = {}) {
  const s = await openai.completions.create({ model: MODEL, prompt, max_tokens: MAX, temperature: 0,
    ignore_eos: true, stream: true, stream_options: { include_usage: true }, ...extra });
  let text = '';
  let usage = null;
  for await (const chunk of s) {
    text += chunk.choices[0]?.text ?? '';
    if (chunk.usage)
      usage = chunk.usage;
  }
  return { text, usage };
}

test('each prompt alone', T, async () => {
  for (const p of PROMPTS) {
    const { text, usage } = await complete(p);
    assert.equal(usage.completion_tokens, MAX);
    alone.push(text);
  }
  assert.ok(new Set(alone).size >= 2, `distinct answers: ${JSON.stringify(alone)}`);
});

test('the same answers with 8 requests at once, and staggered', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const together = await Promise.all(PROMPTS.map((p) => complete(p)));
  assert.deepEqual(together.map((g) => g.text), alone);
  const staggered = await Promise.all(PROMPTS.map(async (p, i) => {
    await sleep(40 * i);
    return complete(p);
  }));
  assert.deepEqual(staggered.map((g) => g.text), alone);
});

test('the same answer from cairn generate', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const r = await runCairn(['generate', '-m', modelPath, '-p', PROMPTS[1], '-n', String(MAX), '--temp', '0',
    '--ignore-eos', '-t', '1']);
  assert.equal(r.code, 0, r.stderr.toString());
  assert.equal(r.stdout.toString().replace(/\n$/, ''), alone[1]); // generate ends its text with a newline
});

test('a dense draft for the mixture: the same answers, drafted tokens counted', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const r = await http(`${node.url}/instance/${instance}/draft_model`,
    { method: 'PUT', body: { draft_model: DRAFT, num_draft_tokens: 4 } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  let drafted = 0;
  for (let i = 0; i < 4; i++) {
    // the runner loads the draft between its steps: the first answers may come before
    const deadline = Date.now() + 60_000 * SLOW;
    let got = await complete(PROMPTS[i]);
    while (got.usage.draft_tokens === 0 && Date.now() < deadline) {
      assert.equal(got.text, alone[i], `prompt ${JSON.stringify(PROMPTS[i])}`);
      await sleep(200);
      got = await complete(PROMPTS[i]);
    }
    assert.equal(got.text, alone[i], `prompt ${JSON.stringify(PROMPTS[i])} with the draft`);
    assert.ok(got.usage.accepted_draft_tokens <= got.usage.draft_tokens);
    drafted += got.usage.draft_tokens;
  }
  assert.ok(drafted > 0, 'the draft proposed tokens');
  assert.ok(await metric(node, 'cairn_draft_tokens_total') >= drafted);
  const together = await Promise.all(PROMPTS.map((p) => complete(p)));
  assert.deepEqual(together.map((g) => g.text), alone, '8 at once with the draft');
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
