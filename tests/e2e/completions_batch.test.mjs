// The rest of OpenAI's completions surface, with the openai package against one `cairn
// node`: prompt as a list of texts or of token-id lists (n choices each, choice i * n + j
// the j-th of prompt i, each the same as the prompt alone), and the cancel route, which
// ends a running generation so that the reply or stream ends normally with
// finish_reason "stop" and the text so far.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, tokenIds, http, assertStopsCleanly } from './cairn.mjs';

const MODEL = 'qwen-small';
const T = { timeout: 300_000 * SLOW };
let dir, node, openai;

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await makeModel(models, MODEL);
  node = await startNode(dir, models, { expectModels: [MODEL] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

test('completions: a list of prompts, n choices each, in OpenAI order', T, async () => {
  const prompts = ['Once upon a time', 'The capital of France is', 'def fib(n):'];
  const ask = { model: MODEL, max_tokens: 6, temperature: 0.9, seed: 11 };
  const alone = [];
  for (const prompt of prompts)
    alone.push(await openai.completions.create({ ...ask, prompt, n: 2 }));
  const batch = await openai.completions.create({ ...ask, prompt: prompts, n: 2 });
  assert.equal(batch.choices.length, 6);
  for (const [i, a] of alone.entries())
    for (let j = 0; j < 2; j++) {
      const c = batch.choices[i * 2 + j];
      assert.equal(c.index, i * 2 + j);
      assert.equal(c.text, a.choices[j].text, `prompt ${i}, choice ${j}`);
    }
  assert.equal(batch.usage.prompt_tokens, alone.reduce((s, a) => s + a.usage.prompt_tokens, 0));
  // token-id lists, and a stream of them
  const ids = await Promise.all(prompts.map((p) => tokenIds(p)));
  const byIds = await openai.completions.create({ ...ask, prompt: ids, n: 2 });
  assert.deepEqual(byIds.choices.map((c) => c.text), batch.choices.map((c) => c.text));
  const stream = await openai.completions.create({ ...ask, prompt: ids, n: 2, stream: true });
  const texts = Array(6).fill('');
  const finish = Array(6).fill(null);
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      texts[c.index] += c.text;
      if (c.finish_reason)
        finish[c.index] = c.finish_reason;
    }
  assert.deepEqual(texts, batch.choices.map((c) => c.text));
  assert.ok(finish.every((f) => f === 'length'), JSON.stringify(finish));
  // too many choices, a bad entry
  const many = await http(`${node.url}/v1/completions`, { body: { model: MODEL, prompt: prompts, n: 6 } });
  assert.equal(many.status, 400);
  assert.match(many.json.error.message, /18 choices/);
  const bad = await http(`${node.url}/v1/completions`, { body: { model: MODEL, prompt: ['a', [1, 'x']] } });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /^prompt\[1\]\[1\]/);
});

test('cancel: ends a running generation with finish_reason stop', T, async () => {
  // streamed: cancel after the first chunks, by the id the chunks carry
  const stream = await openai.chat.completions.create({ model: MODEL, max_tokens: 100000, temperature: 0,
    ignore_eos: true, stream: true, messages: [{ role: 'user', content: 'Go on forever.' }] });
  let id = null, text = '', finish = null, chunks = 0;
  for await (const chunk of stream) {
    id = chunk.id;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      finish = c.finish_reason ?? finish;
    }
    if (++chunks === 5) {
      const r = await http(`${node.url}/v1/chat/completions/${id}/cancel`, { body: {} });
      assert.equal(r.status, 200, JSON.stringify(r.json));
      assert.equal(r.json.id, id);
    }
  }
  assert.equal(finish, 'stop');
  assert.ok(chunks >= 5 && text.length > 0);
  // the legacy completions stream, through the short alias
  const s2 = await openai.completions.create({ model: MODEL, prompt: 'Count:', max_tokens: 100000, temperature: 0,
    ignore_eos: true, stream: true });
  let n2 = 0, fin2 = null;
  for await (const chunk of s2) {
    if (++n2 === 3)
      assert.equal((await http(`${node.url}/v1/cancel/${chunk.id}`, { body: {} })).status, 200);
    for (const c of chunk.choices)
      fin2 = c.finish_reason ?? fin2;
  }
  assert.equal(fin2, 'stop');
  // an id no request has (or had: the first one has ended)
  for (const missing of ['cmpl-nosuchrequest', id]) {
    const r = await http(`${node.url}/v1/cancel/${missing}`, { body: {} });
    assert.equal(r.status, 404);
    assert.equal(r.json.error.code, null);
  }
});

test('the node exits 0 on SIGTERM, its runners with it', T, async () => {
  await assertStopsCleanly(node);
  assert.doesNotMatch(node.log(), /Sanitizer|runtime error/);
});
