// Embeddings through one `cairn node` serving an embedding model (mkmodel's
// qwen3-embed-tiny: qwen3, last-token pooling declared in its metadata) and a generative
// model beside it, with the official packages: openai's embeddings.create (float and
// base64) and ollama's embed; the legacy /api/embeddings; and the refusals (a generative
// model asked for embeddings, the embedding model asked to chat, malformed inputs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { SLOW, QWEN_VOCAB, makeTempDir, removeTempDir, makeModel, mustRun, startNode, tokenIds, http,
  assertStopsCleanly } from './cairn.mjs';

const EMBED = 'qwen3-embed';
const CHAT = 'qwen-small';
const T = { timeout: 300_000 * SLOW };
let dir, node, openai, ollama;

const TEXTS = ['The cat sat on the mat.', 'Embeddings map text to vectors.', 'def f(x): return x * 2',
  'Привет, мир', 'A fourth text, a little longer than the others, to vary the lengths in the batch.'];

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await makeModel(models, CHAT);
  await mustRun(['mkmodel', '--shape', 'qwen3-embed-tiny', '--type', 'q8_0', '--seed', '3', '--vocab', QWEN_VOCAB,
    '-o', path.join(models, `${EMBED}.gguf`)]);
  node = await startNode(dir, models, { expectModels: [EMBED, CHAT] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
  ollama = new Ollama({ host: node.url });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);

test('openai: embeddings.create alone and in a batch', T, async () => {
  const batch = await openai.embeddings.create({ model: EMBED, input: TEXTS, encoding_format: 'float' });
  assert.equal(batch.object, 'list');
  assert.equal(batch.data.length, TEXTS.length);
  const dim = batch.data[0].embedding.length;
  assert.equal(dim, 256);
  for (const [i, d] of batch.data.entries()) {
    assert.equal(d.index, i);
    assert.equal(d.object, 'embedding');
    assert.equal(d.embedding.length, dim);
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-5, `input ${i}: length ${norm(d.embedding)}`);
  }
  assert.ok(batch.usage.prompt_tokens > TEXTS.length);
  assert.equal(batch.usage.total_tokens, batch.usage.prompt_tokens);
  // the same text alone gives the same vector, bit for bit
  for (const i of [0, 3]) {
    const one = await openai.embeddings.create({ model: EMBED, input: TEXTS[i], encoding_format: 'float' });
    assert.deepEqual(one.data[0].embedding, batch.data[i].embedding, `text ${i} alone and in a batch`);
  }
  // different texts differ
  for (let i = 1; i < TEXTS.length; i++)
    assert.ok(dot(batch.data[0].embedding, batch.data[i].embedding) < 0.9999, `texts 0 and ${i}`);
  // the package's default (base64, decoded by the package) gives the same floats
  const b64 = await openai.embeddings.create({ model: EMBED, input: TEXTS });
  for (const [i, d] of b64.data.entries())
    assert.deepEqual(d.embedding.map((x) => Math.fround(x)), batch.data[i].embedding.map((x) => Math.fround(x)));
  // token ids give what the text gives (the tokenizer appends <|endoftext|>)
  const ids = await tokenIds(TEXTS[0]);
  const eos = (await tokenIds('<|endoftext|>'))[0];
  const byIds = await openai.embeddings.create({ model: EMBED, input: [[...ids, eos]], encoding_format: 'float' });
  assert.deepEqual(byIds.data[0].embedding, batch.data[0].embedding);
  // dimensions: the first values, at unit length again
  const short = await openai.embeddings.create({ model: EMBED, input: TEXTS[0], dimensions: 64,
    encoding_format: 'float' });
  assert.equal(short.data[0].embedding.length, 64);
  assert.ok(Math.abs(norm(short.data[0].embedding) - 1) < 1e-5);
});

test('ollama: embed and the legacy embeddings route', T, async () => {
  const r = await ollama.embed({ model: EMBED, input: TEXTS });
  assert.equal(r.embeddings.length, TEXTS.length);
  const one = await ollama.embed({ model: EMBED, input: TEXTS[2] });
  assert.equal(one.embeddings.length, 1);
  assert.deepEqual(one.embeddings[0], r.embeddings[2]);
  assert.ok(r.prompt_eval_count > TEXTS.length);
  for (const v of r.embeddings)
    assert.ok(Math.abs(norm(v) - 1) < 1e-5);
  const oa = await openai.embeddings.create({ model: EMBED, input: TEXTS[2], encoding_format: 'float' });
  assert.deepEqual(one.embeddings[0], oa.data[0].embedding);
  const legacy = await http(`${node.url}/api/embeddings`, { body: { model: EMBED, prompt: TEXTS[2] } });
  assert.equal(legacy.status, 200);
  assert.deepEqual(legacy.json.embedding, r.embeddings[2]);
  // show lists what each model can do, as Ollama does: an embedding model embeds
  const shown = await ollama.show({ model: EMBED });
  assert.deepEqual(shown.capabilities, ['embedding']);
  assert.ok((await ollama.show({ model: CHAT })).capabilities.includes('completion'));
  const cards = (await http(`${node.url}/models`, { method: 'GET' })).json.models;
  assert.equal(cards.find((c) => c.id === EMBED)?.pooling, 'last');
  assert.equal(cards.find((c) => c.id === CHAT)?.pooling, 'none');
});

test('refusals: no pooling, chat on an embedding model, bad inputs, too long', T, async () => {
  const gen = await http(`${node.url}/v1/embeddings`, { body: { model: CHAT, input: 'hello' } });
  assert.equal(gen.status, 400);
  assert.match(gen.json.error.message, /declares no pooling/);
  const chat = await http(`${node.url}/v1/chat/completions`,
    { body: { model: EMBED, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 } });
  assert.equal(chat.status, 400);
  assert.match(chat.json.error.message, /embedding model/);
  const ochat = await http(`${node.url}/api/chat`,
    { body: { model: EMBED, messages: [{ role: 'user', content: 'hi' }], stream: false } });
  assert.equal(ochat.status, 400);
  assert.match(ochat.json.error, /embedding model/);
  for (const [input, re] of [[[], /input/], [[1, -2], /input\[0\]\[1\]/], [[['a']], /input\[0\]\[0\]/], [7, /input/],
    [[''], /input\[0\]: empty/], [[[1, 2], 'x', [1e12]], /input\[2\]\[0\]/]]) {
    const r = await http(`${node.url}/v1/embeddings`, { body: { model: EMBED, input } });
    assert.equal(r.status, 400, JSON.stringify(input));
    assert.match(r.json.error.message, re);
  }
  const fmt = await http(`${node.url}/v1/embeddings`, { body: { model: EMBED, input: 'x', encoding_format: 'int8' } });
  assert.equal(fmt.status, 400);
  const big = await http(`${node.url}/v1/embeddings`, { body: { model: EMBED, input: [[151936 + 5]] } });
  assert.equal(big.status, 400);
  assert.match(big.json.error.message, /vocabulary/);
  const dims = await http(`${node.url}/v1/embeddings`, { body: { model: EMBED, input: 'x', dimensions: 4096 } });
  assert.equal(dims.status, 400);
  assert.match(dims.json.error.message, /dimensions/);
  // longer than the runner's context: OpenAI's route refuses, Ollama's truncates by default
  const long = 'word '.repeat(6000);
  const refused = await http(`${node.url}/v1/embeddings`, { body: { model: EMBED, input: long } });
  assert.equal(refused.status, 400);
  assert.match(refused.json.error.message, /context/);
  const cut = await ollama.embed({ model: EMBED, input: long });
  assert.equal(cut.embeddings.length, 1);
  const notCut = await http(`${node.url}/api/embed`, { body: { model: EMBED, input: long, truncate: false } });
  assert.equal(notCut.status, 400);
});

test('the node exits 0 on SIGTERM, its runners with it', T, async () => {
  await assertStopsCleanly(node);
  assert.doesNotMatch(node.log(), /Sanitizer|runtime error/);
});
