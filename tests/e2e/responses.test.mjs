// OpenAI's Responses API through the official openai package against one `cairn node`
// with a random-weight model: responses.create whole and streamed agree (greedy), the
// stream's typed events come in order with increasing sequence numbers, text.format
// json_schema gives JSON that validates, a forced function tool gives a function_call
// item whose arguments validate, function_call / function_call_output items go back in,
// previous_response_id continues a stored response (GET returns it, DELETE drops it), and bad
// requests are 400s naming the field.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, http } from './cairn.mjs';

const MODEL = 'qwen-small';
const T = { timeout: 300_000 * SLOW };
let dir, node, openai;
const ajv = new Ajv({ strict: false });

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

const outputText = (r) => r.output.filter((o) => o.type === 'message')
  .flatMap((o) => o.content).filter((c) => c.type === 'output_text').map((c) => c.text).join('');

test('responses.create, whole and streamed, agree', T, async () => {
  const ask = { model: MODEL, instructions: 'Be brief.', input: 'Tell me about lighthouses.', max_output_tokens: 8,
    temperature: 0 };
  const r = await openai.responses.create(ask);
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'incomplete'); // a random model does not stop within 8 tokens
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.usage.output_tokens, 8);
  assert.ok(r.usage.input_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.instructions, 'Be brief.');
  const text = outputText(r);
  assert.ok(text.length > 0);
  assert.equal(r.output_text, text); // the SDK's own convenience reads our items

  const stream = await openai.responses.create({ ...ask, stream: true });
  const types = [];
  let seq = -1, deltas = '', done = null, final = null;
  for await (const ev of stream) {
    assert.ok(ev.sequence_number > seq, `sequence ${ev.sequence_number} after ${seq}`);
    seq = ev.sequence_number;
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta')
      deltas += ev.delta;
    if (ev.type === 'response.output_text.done')
      done = ev.text;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete')
      final = ev.response;
  }
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.incomplete']);
  assert.equal(deltas, text);
  assert.equal(done, text);
  assert.equal(outputText(final), text);
  assert.equal(final.usage.output_tokens, 8);
});

test('the SDK stream helper accumulates our events', T, async () => {
  const s = openai.responses.stream({ model: MODEL, input: 'Hi', max_output_tokens: 5, temperature: 0 });
  const r = await s.finalResponse();
  assert.ok(outputText(r).length > 0);
});

test('text.format json_schema validates', T, async () => {
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer' } },
    required: ['name', 'age'], additionalProperties: false };
  for (const stream of [false, true]) {
    const ask = { model: MODEL, input: 'A person as JSON.', max_output_tokens: 60, temperature: 1,
      text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } };
    let r;
    if (stream) {
      r = await openai.responses.stream(ask).finalResponse();
    } else {
      r = await openai.responses.create(ask);
    }
    assert.equal(r.status, 'completed');
    assert.equal(r.text.format.type, 'json_schema');
    const v = JSON.parse(outputText(r));
    assert.ok(ajv.validate(schema, v), JSON.stringify(ajv.errors));
  }
});

test('function tools: a forced call, then its output goes back in', T, async () => {
  const params = { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'],
    additionalProperties: false };
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: params,
    strict: true }];
  const r = await openai.responses.create({ model: MODEL, input: 'Weather in Paris?', tools,
    tool_choice: { type: 'function', name: 'get_weather' }, max_output_tokens: 60, temperature: 1 });
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, 'get_weather');
  assert.match(calls[0].call_id, /^call_/);
  assert.ok(ajv.validate(params, JSON.parse(calls[0].arguments)), calls[0].arguments);

  // Streamed, the call's arguments come as function_call_arguments events.
  const types = [];
  let args = null;
  for await (const ev of await openai.responses.create({ model: MODEL, input: 'Weather in Oslo?', tools,
    tool_choice: 'required', max_output_tokens: 60, temperature: 0, stream: true })) {
    types.push(ev.type);
    if (ev.type === 'response.function_call_arguments.done')
      args = ev.arguments;
  }
  assert.ok(types.includes('response.function_call_arguments.delta'), types.join());
  assert.ok(ajv.validate(params, JSON.parse(args)), args);

  const next = await openai.responses.create({ model: MODEL, tools, max_output_tokens: 4, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Weather in Paris?' }] }, calls[0],
      { type: 'function_call_output', call_id: calls[0].call_id, output: '{"temp": 21}' }] });
  assert.ok(next.usage.input_tokens > r.usage.input_tokens, 'the call and its output reached the prompt');
});

test('previous_response_id continues a stored response; GET returns it, DELETE drops it', T, async () => {
  const a = await openai.responses.create({ model: MODEL, input: 'My name is Ada.', max_output_tokens: 4,
    temperature: 0 });
  const b = await openai.responses.create({ model: MODEL, input: 'What is my name?', previous_response_id: a.id,
    max_output_tokens: 4, temperature: 0 });
  assert.equal(b.previous_response_id, a.id);
  const alone = await openai.responses.create({ model: MODEL, input: 'What is my name?', max_output_tokens: 4,
    temperature: 0 });
  assert.ok(b.usage.input_tokens > alone.usage.input_tokens + a.usage.output_tokens,
    `${b.usage.input_tokens} input tokens with the previous turn, ${alone.usage.input_tokens} without`);
  const got = await openai.responses.retrieve(a.id);
  assert.equal(got.id, a.id);
  assert.equal(outputText(got), outputText(a));

  await openai.responses.delete(b.id);
  await assert.rejects(openai.responses.retrieve(b.id), (e) => e.status === 404);

  const unstored = await openai.responses.create({ model: MODEL, input: 'x', store: false, max_output_tokens: 2 });
  await assert.rejects(openai.responses.retrieve(unstored.id), (e) => e.status === 404);
  await assert.rejects(openai.responses.create({ model: MODEL, input: 'x', previous_response_id: 'resp_nope' }),
    (e) => e.status === 400 && /previous_response_id/.test(e.message));
});

test('bad requests are 400s naming the field', T, async () => {
  const cases = [
    [{ model: MODEL }, /input/],
    [{ model: MODEL, input: 7 }, /input/],
    [{ model: MODEL, input: [{ type: 'input_image', image_url: 'x' }] }, /input\[0\]/],
    [{ model: MODEL, input: [{ role: 'user', content: [{ type: 'input_image' }] }] }, /input\[0\]\.content\[0\]/],
    [{ model: MODEL, input: 'x', tools: [{ type: 'web_search' }] }, /tools\[0\]/],
    [{ model: MODEL, input: 'x', text: { format: { type: 'json_schema', schema: { type: 'string', pattern: 'a+' } } } },
      /text\.format\.schema.*pattern/],
    [{ model: MODEL, input: 'x', max_output_tokens: 0 }, /max_output_tokens/],
    [{ model: MODEL, input: 'x', tool_choice: { type: 'function', name: 'nope' } }, /tool_choice/],
  ];
  for (const [body, re] of cases) {
    const r = await http(`${node.url}/v1/responses`, { body });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.match(r.json.error.message, re, JSON.stringify(r.json));
  }
});
