// Stop sequences and tool calls through the three SDKs, on script models: models made by
// `cairn mkmodel --script-ids` whose greedy output after the Qwen2.5 template's generation
// prompt is a fixed text, so the expected answers are known exactly. (Writing a script
// model with the 152k-token Qwen2 vocabulary takes mkmodel seconds of CPU, so there are
// only two, made in parallel.)
//
// A script model's next token depends only on the current one, and every turn of a chat
// ends with the same generation prompt, so a model that calls a tool calls it again
// whatever the tool answered. The tool round trip therefore sends the second turn (the
// call and its result in the history) to a second script model with the same template
// and vocabulary, which answers in text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { SLOW, makeTempDir, removeTempDir, makeScriptModel, startNode, assertStopsCleanly } from './cairn.mjs';

const TOOL = 'qwen-tool', ANSWER = 'qwen-answer';
const ANSWER_TEXT = 'It is sunny in Paris today.';
const T = { timeout: 120_000 * SLOW };
let dir, node, openai, anthropic, ollama;

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await Promise.all([
    makeScriptModel(models, ANSWER, [ANSWER_TEXT, '<|im_end|>']),
    // A Hermes tool call as the Qwen2.5 template asks for it. Tokenized as one text, the
    // JSON repeats tokens with different successors ('":"' before a value, '_call' before
    // '>\n' and '>'), so the text is written in pieces that a script model can express.
    makeScriptModel(models, TOOL, ['<tool_call>\n{"name":"get_weather","arguments":{"city": "Paris"}}\n</',
      'to', 'ol', '_', 'call', '>', '<|im_end|>']),
  ]);
  node = await startNode(dir, models, { expectModels: [TOOL, ANSWER] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOW });
  anthropic = new Anthropic({ baseURL: node.url, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOW });
  ollama = new Ollama({ host: node.url });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

const hi = [{ role: 'user', content: 'Say something.' }];

async function openaiStream(body) {
  const s = await openai.chat.completions.create({ ...body, stream: true });
  let text = '', finish = null;
  const calls = [];
  for await (const chunk of s)
    for (const ch of chunk.choices) {
      text += ch.delta.content ?? '';
      for (const tc of ch.delta.tool_calls ?? []) {
        const c = (calls[tc.index] ??= { id: '', name: '', arguments: '' });
        c.id += tc.id ?? '';
        c.name += tc.function?.name ?? '';
        c.arguments += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason)
        finish = ch.finish_reason;
    }
  return { text, finish, calls };
}

// Each case: the stop strings and the text expected before the first of them.
const STOPS = [
  { stop: ['sunny'], before: 'It is ' },
  { stop: ['unn'], before: 'It is s' },                   // inside a token
  { stop: ['y in Par'], before: 'It is sunn' },           // across tokens
  { stop: ['Paris', ' is'], before: 'It' },               // the earliest wins
  { stop: ['.'], before: 'It is sunny in Paris today' },
];

test('the script model says its text (no stop)', T, async () => {
  const r = await openai.chat.completions.create({ model: ANSWER, messages: hi, max_tokens: 64, temperature: 0 });
  assert.equal(r.choices[0].message.content, ANSWER_TEXT);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const a = await anthropic.messages.create({ model: ANSWER, messages: hi, max_tokens: 64, temperature: 0 });
  assert.equal(a.content[0].text, ANSWER_TEXT);
  assert.equal(a.stop_reason, 'end_turn');
  assert.equal(a.stop_sequence, null);
});

test('OpenAI stop', T, async () => {
  for (const { stop, before: want } of STOPS) {
    const body = { model: ANSWER, messages: hi, max_tokens: 64, temperature: 0, stop };
    const r = await openai.chat.completions.create(body);
    const c = r.choices[0];
    assert.equal(c.message.content, want, `stop ${JSON.stringify(stop)}`);
    assert.equal(c.finish_reason, 'stop');
    const s = await openaiStream(body);
    assert.equal(s.text, want, `streamed, stop ${JSON.stringify(stop)}`);
    assert.equal(s.finish, 'stop');
  }
  // A single string is a stop too, and the legacy completions endpoint honours it.
  const one = await openai.chat.completions.create({ model: ANSWER, messages: hi, max_tokens: 64, temperature: 0,
    stop: 'today' });
  assert.equal(one.choices[0].message.content, 'It is sunny in Paris ');
  const legacy = await openai.completions.create({ model: ANSWER, prompt: 'Say it\n', max_tokens: 64, temperature: 0,
    stop: ['Paris'] });
  assert.equal(legacy.choices[0].text, 'It is sunny in ');
  assert.equal(legacy.choices[0].finish_reason, 'stop');
});

test('Anthropic stop_sequences', T, async () => {
  for (const { stop, before: want } of STOPS) {
    const body = { model: ANSWER, messages: hi, max_tokens: 64, temperature: 0, stop_sequences: stop };
    const r = await anthropic.messages.create(body);
    assert.equal(r.content[0].text, want, `stop ${JSON.stringify(stop)}`);
    assert.equal(r.stop_reason, 'stop_sequence');
    assert.ok(stop.includes(r.stop_sequence), `stop_sequence ${r.stop_sequence}`);
    const m = await anthropic.messages.stream(body).finalMessage();
    assert.equal(m.content[0].text, want, `streamed, stop ${JSON.stringify(stop)}`);
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, r.stop_sequence);
  }
});

test('Ollama options.stop', T, async () => {
  for (const { stop, before: want } of STOPS) {
    const body = { model: ANSWER, messages: hi, options: { temperature: 0, num_predict: 64, stop } };
    const r = await ollama.chat(body);
    assert.equal(r.message.content, want, `stop ${JSON.stringify(stop)}`);
    assert.equal(r.done_reason, 'stop');
    let text = '', last = null;
    for await (const part of await ollama.chat({ ...body, stream: true })) {
      text += part.message.content;
      last = part;
    }
    assert.equal(text, want, `streamed, stop ${JSON.stringify(stop)}`);
    assert.equal(last.done_reason, 'stop');
  }
  const g = await ollama.generate({ model: ANSWER, prompt: 'Say it', options: { temperature: 0, num_predict: 64,
    stop: ['today'] } });
  assert.equal(g.response, 'It is sunny in Paris ');
});

// ---- tools ----

const weatherParams = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const openaiTools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
  parameters: weatherParams } }];
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('OpenAI tool call and its result', T, async () => {
  const body = { model: TOOL, messages: ask, tools: openaiTools, max_tokens: 64, temperature: 0 };
  const r = await openai.chat.completions.create(body);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.ok(!c.message.content, `no text: ${JSON.stringify(c.message.content)}`);
  assert.equal(c.message.tool_calls.length, 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(typeof call.id === 'string' && call.id.length > 0);

  const s = await openaiStream(body);
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.text, '');
  assert.equal(s.calls.length, 1);
  assert.equal(s.calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(s.calls[0].arguments), { city: 'Paris' });
  assert.ok(s.calls[0].id.length > 0);

  const history = [...ask, c.message,
    { role: 'tool', tool_call_id: call.id, content: '{"sky": "sunny", "celsius": 21}' }];
  const r2 = await openai.chat.completions.create({ model: ANSWER, messages: history, tools: openaiTools,
    max_tokens: 64, temperature: 0 });
  assert.equal(r2.choices[0].message.content, ANSWER_TEXT);
  assert.equal(r2.choices[0].finish_reason, 'stop');
  assert.ok(!r2.choices[0].message.tool_calls?.length);
  assert.ok(r2.usage.prompt_tokens > r.usage.prompt_tokens, 'the call and its result are in the prompt');

  // The tool model itself takes the history too (and, being a script, calls again).
  const again = await openai.chat.completions.create({ ...body, messages: history });
  assert.equal(again.choices[0].finish_reason, 'tool_calls');
});

test('OpenAI n=2 with tools: two choices, each with its own call id', T, async () => {
  const r = await openai.chat.completions.create({ model: TOOL, messages: ask, tools: openaiTools, max_tokens: 64,
    temperature: 0, n: 2 });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'tool_calls');
    assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), { city: 'Paris' });
  }
  assert.notEqual(r.choices[0].message.tool_calls[0].id, r.choices[1].message.tool_calls[0].id);
});

test('Anthropic tool_use and tool_result', T, async () => {
  const tools = [{ name: 'get_weather', description: 'Current weather of a city', input_schema: weatherParams }];
  const body = { model: TOOL, messages: ask, tools, max_tokens: 64, temperature: 0 };
  const r = await anthropic.messages.create(body);
  assert.equal(r.stop_reason, 'tool_use');
  const uses = r.content.filter((b) => b.type === 'tool_use');
  assert.equal(uses.length, 1);
  assert.equal(uses[0].name, 'get_weather');
  assert.deepEqual(uses[0].input, { city: 'Paris' });
  assert.ok(uses[0].id.length > 0);
  for (const b of r.content.filter((b) => b.type === 'text'))
    assert.ok(!b.text.includes('tool_call'), 'no raw tool-call markup in the text');

  const m = await anthropic.messages.stream(body).finalMessage();
  assert.equal(m.stop_reason, 'tool_use');
  const su = m.content.filter((b) => b.type === 'tool_use');
  assert.equal(su.length, 1);
  assert.deepEqual(su[0].input, { city: 'Paris' });

  const history = [...ask, { role: 'assistant', content: r.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: 'sunny, 21 C' }] }];
  const r2 = await anthropic.messages.create({ model: ANSWER, messages: history, tools, max_tokens: 64,
    temperature: 0 });
  assert.equal(r2.stop_reason, 'end_turn');
  assert.deepEqual(r2.content.map((b) => b.type), ['text']);
  assert.equal(r2.content[0].text, ANSWER_TEXT);
  assert.ok(r2.usage.input_tokens + (r2.usage.cache_read_input_tokens ?? 0) >
    r.usage.input_tokens + (r.usage.cache_read_input_tokens ?? 0));
});

test('Ollama tool_calls and the tool message', T, async () => {
  const body = { model: TOOL, messages: ask, tools: openaiTools, options: { temperature: 0, num_predict: 64 } };
  const r = await ollama.chat(body);
  assert.equal(r.done, true);
  assert.equal(r.message.tool_calls?.length, 1, JSON.stringify(r.message));
  assert.equal(r.message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(r.message.tool_calls[0].function.arguments, { city: 'Paris' });
  assert.ok(!r.message.content.includes('tool_call'), 'no raw tool-call markup in the text');

  const calls = [];
  for await (const part of await ollama.chat({ ...body, stream: true }))
    calls.push(...(part.message.tool_calls ?? []));
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0].function.arguments, { city: 'Paris' });

  const history = [...ask, r.message, { role: 'tool', content: 'sunny, 21 C' }];
  const r2 = await ollama.chat({ ...body, model: ANSWER, messages: history });
  assert.equal(r2.message.content, ANSWER_TEXT);
  assert.ok(!r2.message.tool_calls?.length);
  assert.ok(r2.prompt_eval_count > r.prompt_eval_count);
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
