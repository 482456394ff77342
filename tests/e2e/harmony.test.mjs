// gpt-oss's harmony format through the APIs (issue 19): script models with gpt-oss's chat
// template and the Qwen2 vocabulary extended with the harmony control tokens (`cairn
// mkmodel --add-tokens`), whose greedy output after the template's generation prompt
// ("<|start|>assistant") is a fixed harmony text. The analysis channel comes back as
// reasoning_content, the final channel as content, a message to functions.NAME as a
// tool call; the markers never reach the client. (A script model's next token depends
// only on the current one, so each model says one kind of message.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, SHARED, QWEN_VOCAB, makeTempDir, removeTempDir, runCairn, startNode } from './cairn.mjs';

const HARMONY = ['<|start|>', '<|end|>', '<|message|>', '<|channel|>', '<|constrain|>', '<|return|>', '<|call|>'];
const TEMPLATE = path.join(SHARED, 'testdata/templates/openai-gpt-oss-120b.jinja');
const SCRIPT_SHAPE = ['--arch', 'qwen2', '--n-embd', '128', '--n-layers', '1', '--n-head', '4', '--n-head-kv', '2',
  '--n-ff', '128'];
const T = { timeout: 180_000 * SLOW };
const REASONING = 'The user wants a greeting.', ANSWER = 'Hello there, friend!';
let dir, node, openai;

// Ids of segments in the extended vocabulary, tokenized with a model that has it (the
// markers are its control tokens, parsed as such).
let vocabModel;
async function ids(segments) {
  const out = [];
  for (const s of segments) {
    const r = await runCairn(['tokenize', '-m', vocabModel, '--special', '--no-bos', '--ids', s]);
    assert.equal(r.code, 0, r.stderr);
    out.push(...r.stdout.toString().trim().split(/\s+/).map(Number));
  }
  return out;
}

async function makeHarmonyModel(models, name, segments) {
  const script = await ids(['assistant', ...segments]);
  const r = await runCairn(['mkmodel', ...SCRIPT_SHAPE, '--type', 'q8_0', '--vocab', QWEN_VOCAB, '--add-tokens',
    HARMONY.join(','), '--chat-template', TEMPLATE, '--script-ids', script.join(','), '-o',
    path.join(models, `${name}.gguf`)]);
  assert.equal(r.code, 0, r.stderr);
}

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  fs.mkdirSync(models, { recursive: true });
  vocabModel = path.join(dir, 'vocab.gguf');
  const v = await runCairn(['mkmodel', ...SCRIPT_SHAPE, '--vocab', QWEN_VOCAB, '--add-tokens', HARMONY.join(','),
    '-o', vocabModel]);
  assert.equal(v.code, 0, v.stderr);
  assert.deepEqual(await ids(HARMONY), HARMONY.map((_, i) => 151936 + i), 'the markers follow the vocabulary');
  await Promise.all([
    makeHarmonyModel(models, 'oss-think', ['<|channel|>', 'analysis', '<|message|>', REASONING, '<|end|>',
      '<|return|>']),
    makeHarmonyModel(models, 'oss-answer', ['<|channel|>', 'final', '<|message|>', ANSWER, '<|return|>']),
    makeHarmonyModel(models, 'oss-tool', ['<|channel|>', 'commentary to=functions.get_weather ', '<|constrain|>',
      'json', '<|message|>', '{"city": "Paris"}', '<|call|>']),
  ]);
  node = await startNode(dir, models, { expectModels: ['oss-think', 'oss-answer', 'oss-tool'] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOW });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

const hi = [{ role: 'user', content: 'Say hello.' }];
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

async function streamed(body) {
  const s = await openai.chat.completions.create({ ...body, stream: true });
  const r = { content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of s)
    for (const ch of chunk.choices) {
      r.content += ch.delta.content ?? '';
      r.reasoning += ch.delta.reasoning_content ?? '';
      for (const tc of ch.delta.tool_calls ?? []) {
        const c = (r.calls[tc.index] ??= { name: '', arguments: '' });
        c.name += tc.function?.name ?? '';
        c.arguments += tc.function?.arguments ?? '';
      }
      r.finish = ch.finish_reason ?? r.finish;
    }
  return r;
}

test('the final channel is the content, without its header', T, async () => {
  const body = { model: 'oss-answer', messages: hi, max_tokens: 64, temperature: 0 };
  const r = await openai.chat.completions.create(body);
  assert.equal(r.choices[0].message.content, ANSWER);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await streamed(body);
  assert.equal(s.content, ANSWER);
  assert.equal(s.reasoning, '');
});

test('the analysis channel is reasoning_content', T, async () => {
  const body = { model: 'oss-think', messages: hi, max_tokens: 64, temperature: 0 };
  const r = await openai.chat.completions.create(body);
  assert.equal(r.choices[0].message.reasoning_content, REASONING);
  assert.equal(r.choices[0].message.content ?? '', '');
  const s = await streamed(body);
  assert.equal(s.reasoning, REASONING);
  assert.equal(s.content, '');
});

test('a message to functions.NAME is a tool call, and its result goes back through the template', T, async () => {
  const body = { model: 'oss-tool', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: TOOLS,
    max_tokens: 64, temperature: 0 };
  const r = await openai.chat.completions.create(body);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), { city: 'Paris' });
  assert.ok(!(c.message.content ?? '').includes('<|'), 'no marker in the content');
  const s = await streamed(body);
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(s.calls[0].arguments), { city: 'Paris' });
  // the call and its result in the history, answered by another model of the same template
  const next = await openai.chat.completions.create({ model: 'oss-answer', tools: TOOLS, max_tokens: 64,
    temperature: 0, messages: [...body.messages, { role: 'assistant', content: null,
      reasoning_content: 'Need the weather.', tool_calls: c.message.tool_calls },
    { role: 'tool', tool_call_id: c.message.tool_calls[0].id, content: '{"sky": "clear"}' }] });
  assert.equal(next.choices[0].message.content, ANSWER);
});
