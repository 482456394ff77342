// Speculative decoding through the cluster: an instance placed with a draft model gives
// exactly the greedy answers of plain decoding, reports drafted and accepted tokens in
// usage and /metrics, and keeps every stream intact while the draft is switched and
// cleared under it (PUT /instance/<id>/draft_model). A draft of another vocabulary is
// refused with the reason.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, SHARED, makeTempDir, removeTempDir, makeModel, startNode, runCairn, http, metric, sleep,
  assertStopsCleanly } from './cairn.mjs';

const TARGET = 'qwen-small';
const DRAFT = 'qwen-draft';
const OTHER = 'llama-other';
const MAX = 48;
const T = { timeout: 300_000 * SLOW };
const PROMPTS = ['Hello', 'Tell me about cats.', 'What is 2+2?', 'Why is the sky blue?'];
let dir, node, openai, instance;
const plain = [];

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  const target = await makeModel(models, TARGET);
  const r = await runCairn(['mkmodel', '--draft-of', target, '--layers', '2', '-o', path.join(models, `${DRAFT}.gguf`)]);
  assert.equal(r.code, 0, r.stderr);
  const o = await runCairn(['mkmodel', '--shape', 'tiny', '--vocab',
    path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-bpe.gguf'), '-o', path.join(models, `${OTHER}.gguf`)]);
  assert.equal(o.code, 0, o.stderr);
  node = await startNode(dir, models, { parallel: 8, expectModels: [TARGET, DRAFT, OTHER] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

// A streamed greedy completion of exactly MAX tokens; its text and final usage.
async function complete(prompt, extra = {}) {
  const s = await openai.completions.create({ model: TARGET, prompt, max_tokens: MAX, temperature: 0,
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

test('a draft of another vocabulary is refused with the reason', T, async () => {
  const r = await http(`${node.url}/place_instance`, { body: { model_id: TARGET, draft_model: OTHER } });
  assert.equal(r.status, 400);
  assert.match(JSON.stringify(r.json), /vocabular/);
});

test('plain answers', T, async () => {
  const r = await http(`${node.url}/place_instance`, { body: { model_id: TARGET } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  instance = r.json.instance_id;
  for (const p of PROMPTS) {
    const { text, usage } = await complete(p);
    assert.equal(usage.completion_tokens, MAX);
    assert.equal(usage.draft_tokens, 0);
    plain.push(text);
  }
});

test('with a draft: the same answers, drafted and accepted tokens counted', T, async (t) => {
  if (plain.length !== PROMPTS.length)
    return t.skip('no plain answers');
  const r = await http(`${node.url}/instance/${instance}/draft_model`,
    { method: 'PUT', body: { draft_model: DRAFT, num_draft_tokens: 4 } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  let drafted = 0, accepted = 0;
  for (let i = 0; i < PROMPTS.length; i++) {
    // The runner loads the draft between its steps: the first answers may come before.
    const deadline = Date.now() + 60_000 * SLOW;
    let got = await complete(PROMPTS[i]);
    while (got.usage.draft_tokens === 0 && Date.now() < deadline) {
      assert.equal(got.text, plain[i], `prompt ${JSON.stringify(PROMPTS[i])}`);
      await sleep(200);
      got = await complete(PROMPTS[i]);
    }
    assert.equal(got.text, plain[i], `prompt ${JSON.stringify(PROMPTS[i])}`);
    drafted += got.usage.draft_tokens;
    accepted += got.usage.accepted_draft_tokens;
    assert.ok(got.usage.accepted_draft_tokens <= got.usage.draft_tokens);
  }
  assert.ok(drafted > 0, 'the draft proposed tokens');
  assert.ok(accepted > 0, 'the target kept some of them (the draft shares its first layers)');
  assert.ok(await metric(node, 'cairn_draft_tokens_total') >= drafted);
  // per request: no speculation for this one
  const off = await complete(PROMPTS[0], { num_draft_tokens: 0 });
  assert.equal(off.text, plain[0]);
  assert.equal(off.usage.draft_tokens, 0);
});

test('switching and clearing the draft while 4 streams run loses and alters nothing', T, async (t) => {
  if (plain.length !== PROMPTS.length)
    return t.skip('no plain answers');
  const streams = PROMPTS.map((p) => complete(p));
  const put = (body) => http(`${node.url}/instance/${instance}/draft_model`, { method: 'PUT', body });
  for (const body of [{ draft_model: null }, { draft_model: DRAFT, num_draft_tokens: 2 }, { draft_model: null },
    { draft_model: DRAFT, num_draft_tokens: 6 }]) {
    const r = await put(body);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    await sleep(30);
  }
  const got = await Promise.all(streams);
  for (let i = 0; i < PROMPTS.length; i++) {
    assert.equal(got[i].usage.completion_tokens, MAX);
    assert.equal(got[i].text, plain[i], `prompt ${JSON.stringify(PROMPTS[i])}`);
  }
});

test('prompt lookup per request: the same answer', T, async (t) => {
  if (plain.length !== PROMPTS.length)
    return t.skip('no plain answers');
  const got = await complete(PROMPTS[1], { prompt_lookup: true });
  assert.equal(got.text, plain[1]);
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
