// What agent frameworks call, through their own packages, against one `cairn node` with
// a random-weight model (which never writes valid JSON or a tool call by chance): the
// openai package's chat.completions.parse with a zod schema and completions with token
// id prompts; LangChain's withStructuredOutput and bindTools (@langchain/openai); the
// Vercel AI SDK's generateObject and streamText (ai + @ai-sdk/openai-compatible).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import { ChatOpenAI } from '@langchain/openai';
import { generateObject, streamText } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, tokenIds, http } from './cairn.mjs';

const MODEL = 'qwen-small';
const T = { timeout: 300_000 * SLOW };
let dir, node, openai;

const Person = z.object({
  name: z.string().max(8),
  age: z.number().int(),
  kind: z.enum(['cat', 'dog']),
  tags: z.array(z.string().max(4)).max(2),
  note: z.string().max(6).nullable(),
});

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

test('openai: chat.completions.parse with a zod schema', T, async () => {
  for (const temperature of [0, 1]) {
    const r = await openai.chat.completions.parse({ model: MODEL, temperature, max_tokens: 120,
      messages: [{ role: 'user', content: 'A pet as JSON.' }], response_format: zodResponseFormat(Person, 'pet') });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop', m.content);
    assert.ok(m.parsed, m.content);
    assert.deepEqual(Person.parse(m.parsed), m.parsed);
  }
});

test('openai: completions with token id prompts', T, async () => {
  const text = 'Once upon a time';
  const ids = await tokenIds(text);
  assert.ok(ids.length > 2);
  const ask = { model: MODEL, max_tokens: 6, temperature: 0 };
  const byText = await openai.completions.create({ ...ask, prompt: text });
  const byIds = await openai.completions.create({ ...ask, prompt: ids });
  const byBatch = await openai.completions.create({ ...ask, prompt: [ids] });
  assert.equal(byIds.usage.prompt_tokens, ids.length);
  assert.equal(byIds.choices[0].text, byText.choices[0].text);
  assert.equal(byBatch.choices[0].text, byText.choices[0].text);
  const bad = await http(`${node.url}/v1/completions`, { body: { model: MODEL, prompt: [1, 2, 1 << 30] } });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /prompt\[2\].*vocabulary/);
  const neg = await http(`${node.url}/v1/completions`, { body: { model: MODEL, prompt: [[1, -2]] } });
  assert.equal(neg.status, 400);
  assert.match(neg.json.error.message, /^prompt\[0\]\[1\]/);
});

function chatModel(extra = {}) {
  return new ChatOpenAI({ model: MODEL, apiKey: 'unused', configuration: { baseURL: `${node.url}/v1` },
    maxRetries: 0, maxTokens: 120, ...extra });
}

test('LangChain: withStructuredOutput and bindTools', T, async () => {
  for (const method of ['jsonSchema', 'functionCalling']) {
    const structured = chatModel({ temperature: 1 }).withStructuredOutput(Person, { name: 'pet', method });
    const pet = await structured.invoke('A pet, please.');
    assert.deepEqual(Person.parse(pet), pet, method);
  }
  const weather = { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'],
      additionalProperties: false } } };
  const withTools = chatModel({ temperature: 0 }).bindTools([weather], { tool_choice: 'get_weather' });
  const msg = await withTools.invoke('Weather in Paris?');
  assert.equal(msg.tool_calls.length, 1, JSON.stringify(msg));
  assert.equal(msg.tool_calls[0].name, 'get_weather');
  assert.equal(typeof msg.tool_calls[0].args.city, 'string');
});

test('AI SDK: generateObject and streamText', T, async () => {
  const cairn = createOpenAICompatible({ name: 'cairn', baseURL: `${node.url}/v1`, apiKey: 'unused',
    supportsStructuredOutputs: true, includeUsage: true });
  const { object } = await generateObject({ model: cairn(MODEL), schema: Person, prompt: 'A pet.', temperature: 1,
    maxOutputTokens: 120, maxRetries: 0 });
  assert.deepEqual(Person.parse(object), object);

  const s = streamText({ model: cairn(MODEL), prompt: 'Tell me a story.', maxOutputTokens: 8, temperature: 0,
    maxRetries: 0 });
  let text = '';
  for await (const part of s.textStream)
    text += part;
  assert.ok(text.length > 0);
  assert.equal(await s.text, text);
  assert.equal(await s.finishReason, 'length');
  const usage = await s.usage;
  assert.equal(usage.outputTokens, 8);
  assert.ok(usage.inputTokens > 5);
});
