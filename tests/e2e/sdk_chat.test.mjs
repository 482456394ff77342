// Chat through the official OpenAI, Anthropic and Ollama client packages against one
// `cairn node`: whole and streamed answers agree, usage counts are sane and agree across
// the three APIs, n=2 gives two choices, and errors arrive as each SDK's own error types.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, assertStopsCleanly } from './cairn.mjs';

const MODEL = 'qwen-small';
const MAX = 6;
const T = { timeout: 120_000 * SLOW };
let dir, node, openai, anthropic, ollama;

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await makeModel(models, MODEL);
  node = await startNode(dir, models, { expectModels: [MODEL] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOW });
  anthropic = new Anthropic({ baseURL: node.url, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOW });
  ollama = new Ollama({ host: node.url });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

const messages = [{ role: 'user', content: 'Tell me a short story about a lighthouse.' }];
const answers = {}; // API -> { text, prompt }

test('OpenAI chat, whole and streamed', T, async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: MAX, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0, 'some text');
  assert.ok(['length', 'stop'].includes(c.finish_reason), c.finish_reason);
  assert.ok(r.usage.prompt_tokens > 0);
  if (c.finish_reason === 'length')
    assert.equal(r.usage.completion_tokens, MAX);
  else
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= MAX);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  // llama-server's timings extension, from the runner's own clock
  assert.ok(r.timings && r.timings.prompt_ms > 0 && r.timings.predicted_ms >= 0, JSON.stringify(r.timings));
  assert.equal(r.timings.predicted_n, r.usage.completion_tokens);
  assert.equal(r.timings.prompt_n, r.usage.prompt_tokens - (r.usage.prompt_tokens_details?.cached_tokens ?? 0));

  const stream = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: MAX, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0, timings = null;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage)
      usage = chunk.usage;
    if (chunk.timings)
      timings = chunk.timings;
    for (const ch of chunk.choices) {
      assert.equal(ch.index, 0);
      text += ch.delta.content ?? '';
      if (ch.finish_reason)
        finish = ch.finish_reason;
    }
  }
  assert.ok(chunks >= 2, 'streamed in several chunks');
  assert.equal(text, c.message.content, 'greedy: streamed text equals the whole answer');
  assert.equal(finish, c.finish_reason);
  assert.ok(usage, 'a usage chunk with include_usage');
  assert.equal(usage.prompt_tokens, r.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, r.usage.completion_tokens);
  assert.ok(timings && timings.prompt_ms > 0 && timings.predicted_n === usage.completion_tokens,
    `timings with the finishing chunk: ${JSON.stringify(timings)}`);
  answers.openai = { text, prompt: r.usage.prompt_tokens, finish };
});

test('Anthropic messages, whole and streamed', T, async () => {
  const r = await anthropic.messages.create({ model: MODEL, messages, max_tokens: MAX, temperature: 0 });
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.content.length, 1);
  assert.equal(r.content[0].type, 'text');
  const text = r.content[0].text;
  assert.ok(text.length > 0);
  assert.ok(['max_tokens', 'end_turn'].includes(r.stop_reason), r.stop_reason);
  // input_tokens counts the prompt tokens not read from the cache.
  const prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens ?? 0);
  assert.ok(prompt > 0);
  if (r.stop_reason === 'max_tokens')
    assert.equal(r.usage.output_tokens, MAX);

  // The SDK's stream helper, which checks the event order as it accumulates.
  const s = anthropic.messages.stream({ model: MODEL, messages, max_tokens: MAX, temperature: 0 });
  let deltas = '';
  s.on('text', (t) => { deltas += t; });
  const m = await s.finalMessage();
  assert.equal(m.content[0].text, text, 'greedy: streamed text equals the whole answer');
  assert.equal(deltas, text);
  assert.equal(m.stop_reason, r.stop_reason);
  assert.equal(m.usage.output_tokens, r.usage.output_tokens);

  // The raw event stream.
  const raw = await anthropic.messages.create({ model: MODEL, messages, max_tokens: MAX, temperature: 0,
    stream: true });
  const types = [];
  let start = null;
  for await (const ev of raw) {
    types.push(ev.type);
    if (ev.type === 'message_start')
      start = ev.message;
  }
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.ok(types.includes('content_block_start') && types.includes('content_block_delta') &&
    types.includes('content_block_stop') && types.includes('message_delta'), types.join(' '));
  assert.ok(start.usage.input_tokens + (start.usage.cache_read_input_tokens ?? 0) > 0);
  answers.anthropic = { text, prompt, finish: r.stop_reason };
});

test('Ollama chat and generate, whole and streamed', T, async () => {
  const r = await ollama.chat({ model: MODEL, messages, options: { temperature: 0, num_predict: MAX } });
  assert.equal(r.done, true);
  assert.equal(r.message.role, 'assistant');
  assert.ok(r.message.content.length > 0);
  assert.ok(['length', 'stop'].includes(r.done_reason), r.done_reason);
  assert.ok(r.prompt_eval_count > 0);
  if (r.done_reason === 'length')
    assert.equal(r.eval_count, MAX);

  const stream = await ollama.chat({ model: MODEL, messages, options: { temperature: 0, num_predict: MAX },
    stream: true });
  let text = '', last = null, parts = 0;
  for await (const part of stream) {
    parts++;
    text += part.message.content;
    last = part;
  }
  assert.ok(parts >= 2);
  assert.equal(text, r.message.content, 'greedy: streamed text equals the whole answer');
  assert.equal(last.done, true);
  assert.equal(last.done_reason, r.done_reason);
  assert.equal(last.eval_count, r.eval_count);
  assert.equal(last.prompt_eval_count, r.prompt_eval_count);
  answers.ollama = { text, prompt: r.prompt_eval_count, finish: r.done_reason };

  const gen = { model: MODEL, prompt: 'Once upon a time', options: { temperature: 0, num_predict: 4 } };
  const g = await ollama.generate(gen);
  assert.equal(g.done, true);
  assert.ok(g.response.length > 0);
  assert.ok(g.prompt_eval_count > 0);
  if (g.done_reason === 'length')
    assert.equal(g.eval_count, 4);
  const gs = await ollama.generate({ ...gen, stream: true });
  let gtext = '';
  for await (const part of gs)
    gtext += part.response;
  assert.equal(gtext, g.response);

  const tags = await ollama.list();
  assert.ok(tags.models.some((m) => m.name.split(':')[0] === MODEL), JSON.stringify(tags));
  const ver = await ollama.version();
  assert.equal(typeof ver.version, 'string');
  const ps = await ollama.ps();
  assert.ok(ps.models.some((m) => m.name.split(':')[0] === MODEL), `loaded after use: ${JSON.stringify(ps)}`);
  const show = await ollama.show({ model: `${MODEL}:latest` });
  assert.equal(show.details.family, 'qwen2');
  assert.match(show.template, /<\|im_start\|>/, 'the model\'s chat template');
});

test('the three APIs render the same prompt and give the same greedy answer', T, async (t) => {
  if (!answers.openai || !answers.anthropic || !answers.ollama)
    return t.skip('an earlier test failed');
  assert.equal(answers.anthropic.text, answers.openai.text);
  assert.equal(answers.ollama.text, answers.openai.text);
  assert.equal(answers.anthropic.prompt, answers.openai.prompt);
  assert.equal(answers.ollama.prompt, answers.openai.prompt);
});

test('OpenAI n=2 gives two choices, whole and streamed', T, async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: MAX, temperature: 0, n: 2 });
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1]);
  for (const c of r.choices) {
    assert.ok(c.message.content.length > 0);
    if (answers.openai)
      assert.equal(c.message.content, answers.openai.text, 'greedy: each choice is the single answer');
  }
  const lengths = r.choices.filter((c) => c.finish_reason === 'length').length;
  if (lengths === 2)
    assert.equal(r.usage.completion_tokens, 2 * MAX);
  assert.ok(r.usage.prompt_tokens > 0);

  // Sampled choices with a temperature: still two, each of at most MAX tokens.
  const hot = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: MAX, temperature: 1.5,
    seed: 42, n: 2 });
  assert.equal(hot.choices.length, 2);
  assert.ok(hot.usage.completion_tokens <= 2 * MAX && hot.usage.completion_tokens >= 2);

  const stream = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: MAX, temperature: 0, n: 2,
    stream: true });
  const texts = ['', ''], finish = [null, null];
  for await (const chunk of stream)
    for (const ch of chunk.choices) {
      assert.ok(ch.index === 0 || ch.index === 1, `index ${ch.index}`);
      texts[ch.index] += ch.delta.content ?? '';
      if (ch.finish_reason)
        finish[ch.index] = ch.finish_reason;
    }
  assert.deepEqual(texts, r.choices.sort((a, b) => a.index - b.index).map((c) => c.message.content));
  assert.ok(finish[0] && finish[1], 'both choices finish');
});

test('errors arrive as the SDKs\' own error types', T, async () => {
  // Unknown model.
  await assert.rejects(openai.chat.completions.create({ model: 'no-such-model', messages, max_tokens: 2 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  await assert.rejects(openai.chat.completions.create({ model: 'no-such-model', messages, max_tokens: 2,
    stream: true }),
    (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(openai.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 }),
    (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(anthropic.messages.create({ model: 'no-such-model', messages, max_tokens: 2 }),
    (e) => e instanceof Anthropic.NotFoundError && e.status === 404);
  await assert.rejects(ollama.chat({ model: 'no-such-model', messages }),
    (e) => e.name === 'ResponseError' && e.status_code === 404);
  await assert.rejects(ollama.generate({ model: 'no-such-model', prompt: 'x' }),
    (e) => e.name === 'ResponseError' && e.status_code === 404);
  await assert.rejects(ollama.show({ model: 'no-such-model' }),
    (e) => e.name === 'ResponseError' && e.status_code === 404);

  // A field of the wrong type or out of range.
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages, max_tokens: 'many' }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages, max_tokens: 2, temperature: -1 }),
    (e) => e instanceof OpenAI.BadRequestError);
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }),
    (e) => e instanceof OpenAI.BadRequestError);
  await assert.rejects(anthropic.messages.create({ model: MODEL, messages, max_tokens: -5 }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400);
  await assert.rejects(anthropic.messages.create({ model: MODEL, messages: [{ role: 'system', content: 'x' }],
    max_tokens: 2 }), (e) => e instanceof Anthropic.BadRequestError);
  await assert.rejects(ollama.chat({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }),
    (e) => e.name === 'ResponseError' && e.status_code === 400);

  // The node still serves.
  const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: 2, temperature: 0 });
  assert.equal(r.choices.length, 1);
});

// A prompt longer than the context. OpenAI answers 400 with code context_length_exceeded,
// which its SDK raises as BadRequestError; Anthropic answers 400 "prompt is too long".
const tooLong = [{ role: 'user', content: 'word '.repeat(6000) }];

test('a prompt longer than the context: a 4xx from each API', T, async () => {
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: tooLong, max_tokens: 2 }),
    (e) => e instanceof OpenAI.APIError && e.status >= 400 && e.status < 500 && e.code === 'context_length_exceeded');
  await assert.rejects(anthropic.messages.create({ model: MODEL, messages: tooLong, max_tokens: 2 }),
    (e) => e instanceof Anthropic.BadRequestError && /too long/.test(e.message));
  await assert.rejects(ollama.chat({ model: MODEL, messages: tooLong, options: { num_predict: 2 } }),
    (e) => e.name === 'ResponseError' && e.status_code >= 400 && e.status_code < 500);
});

// The contract is 413 for a prompt the context cannot hold (OpenAI itself answers
// 400); the SDK raises it as an APIError carrying OpenAI's code, which clients look for.
test('a prompt longer than the context: OpenAI APIError 413 context_length_exceeded', T, async () => {
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: tooLong, max_tokens: 2 }),
    (e) => e instanceof OpenAI.APIError && e.status === 413 && e.code === 'context_length_exceeded');
});

test('Anthropic usage: the same prompt-cache split streamed and whole', T, async () => {
  const body = { model: MODEL, messages, max_tokens: 2, temperature: 0 };
  await anthropic.messages.create(body); // the prompt is in the cache from here on
  const whole = await anthropic.messages.create(body);
  const streamed = await anthropic.messages.stream(body).finalMessage();
  assert.ok(whole.usage.cache_read_input_tokens > 0, 'the repeated prompt is read from the cache');
  assert.equal(streamed.usage.input_tokens, whole.usage.input_tokens);
  assert.equal(streamed.usage.cache_read_input_tokens, whole.usage.cache_read_input_tokens);
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
