// Continuous batching must not change results: the greedy answer to a prompt is the same
// alone, among 7 other concurrent requests (started together, or staggered so that new
// prefills join running decodes), and from `cairn generate --chat` on the same message,
// which renders the same chat template and decodes in a single sequence. The same holds
// for sampling with a seed, which is far more sensitive than greedy decoding of a random
// model (that repeats one token): any change of the logits would show.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, runCairn, sleep,
  assertStopsCleanly } from './cairn.mjs';

const MODEL = 'qwen-small';
const MAX = 16;
const T = { timeout: 240_000 * SLOW };
const PROMPTS = [
  'Hello',
  'Tell me about cats.',
  'What is 2+2?',
  'Zebra',
  'Write a poem about the sea, the wind, and the long grey evenings of November on the coast.',
  'Why is the sky blue?',
  'List three colors',
  'Bonjour, comment allez-vous aujourd\'hui ?',
];
let dir, modelPath, node, openai;
const alone = [];
const sampledAlone = [];
// Sampling parameters given explicitly on both sides (the CLI's defaults otherwise).
const SAMPLING = { temperature: 0.9, top_p: 0.95, top_k: 40, min_p: 0.05 };
const SAMPLING_ARGS = ['--temp', '0.9', '--top-p', '0.95', '--top-k', '40', '--min-p', '0.05'];
const seedOf = (i) => 1000 + 17 * i;

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  modelPath = await makeModel(models, MODEL);
  node = await startNode(dir, models, { parallel: 8, expectModels: [MODEL] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

function ask(content, stream = false, sampling = { temperature: 0 }) {
  const body = { model: MODEL, messages: [{ role: 'user', content }], max_tokens: MAX, ...sampling };
  if (!stream)
    return openai.chat.completions.create(body).then((r) => r.choices[0].message.content);
  return openai.chat.completions.create({ ...body, stream: true }).then(async (s) => {
    let text = '';
    for await (const chunk of s)
      text += chunk.choices[0]?.delta?.content ?? '';
    return text;
  });
}

test('each prompt alone', T, async () => {
  for (const p of PROMPTS)
    alone.push(await ask(p));
  for (const a of alone)
    assert.ok(a.length > 0);
  // The model is random but deterministic: the prompts must not all give one answer, or
  // the comparisons below would prove little.
  assert.ok(new Set(alone).size >= 2, `distinct answers: ${JSON.stringify(alone)}`);
});

test('the same answers with 8 requests at once', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const together = await Promise.all(PROMPTS.map((p, i) => ask(p, i % 2 === 1)));
  assert.deepEqual(together, alone);
});

test('the same answers with staggered requests (prefills join running decodes)', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const pending = [];
  for (let i = PROMPTS.length - 1; i >= 0; i--) {
    pending[i] = ask(PROMPTS[i], i % 3 === 0);
    await sleep(40);
  }
  assert.deepEqual(await Promise.all(pending), alone);
});

test('the same answers from cairn generate --chat', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  for (let i = 0; i < PROMPTS.length; i++) {
    const r = await runCairn(['generate', '-m', modelPath, '--chat', PROMPTS[i], '-n', String(MAX), '--temp', '0']);
    assert.equal(r.code, 0, r.stderr);
    const out = r.stdout.toString();
    assert.ok(out.endsWith('\n'), 'generate ends its text with a newline');
    assert.equal(out.slice(0, -1), alone[i], `prompt ${JSON.stringify(PROMPTS[i])}`);
  }
});

test('seeded sampling: the same answers alone, at once, and from cairn generate', T, async () => {
  for (let i = 0; i < PROMPTS.length; i++)
    sampledAlone.push(await ask(PROMPTS[i], false, { ...SAMPLING, seed: seedOf(i) }));
  assert.ok(new Set(sampledAlone).size >= PROMPTS.length / 2, `distinct answers: ${JSON.stringify(sampledAlone)}`);
  const again = await ask(PROMPTS[0], true, { ...SAMPLING, seed: seedOf(0) });
  assert.equal(again, sampledAlone[0], 'a seed reproduces its answer');
  const together = await Promise.all(PROMPTS.map((p, i) => ask(p, i % 2 === 0, { ...SAMPLING, seed: seedOf(i) })));
  assert.deepEqual(together, sampledAlone);
  for (let i = 0; i < PROMPTS.length; i++) {
    const r = await runCairn(['generate', '-m', modelPath, '--chat', PROMPTS[i], '-n', String(MAX), ...SAMPLING_ARGS,
      '--seed', String(seedOf(i))]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.toString().slice(0, -1), sampledAlone[i], `prompt ${JSON.stringify(PROMPTS[i])}`);
  }
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
