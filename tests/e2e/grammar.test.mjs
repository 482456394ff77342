// Constrained decoding end to end: a random-weight model (which never writes valid JSON
// by chance) answers 100 requests, each with its own JSON Schema, at temperature 0 and
// 1, alone and 8 at once, with and without a draft model set on the instance, and every
// answer validates against its schema with ajv. json_object with a small max_tokens
// still ends in a complete object (the budget closes it); Ollama's format and
// llama.cpp's grammar work; stop strings still apply; unsupported keywords are a 400
// naming them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, runCairn, http } from './cairn.mjs';

const TARGET = 'qwen-small';
const DRAFT = 'qwen-draft';
const T = { timeout: 900_000 * SLOW };
const MAX_TOKENS = 400;
let dir, node, openai, instance;
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  const target = await makeModel(models, TARGET);
  const r = await runCairn(['mkmodel', '--draft-of', target, '--layers', '2', '-o', path.join(models, `${DRAFT}.gguf`)]);
  assert.equal(r.code, 0, r.stderr);
  node = await startNode(dir, models, { parallel: 8, expectModels: [TARGET, DRAFT] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOW });
  const p = await http(`${node.url}/place_instance`, { body: { model_id: TARGET } });
  assert.equal(p.status, 200, JSON.stringify(p.json));
  instance = p.json.instance_id;
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

// Seeded schemas of the shapes zod and pydantic write: objects with required and
// optional properties, additionalProperties false, enums, const, bounded arrays, nested
// objects, anyOf, nullable types, formats, integer vs number, integer ranges.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

function leaf(r, depth) {
  const k = Math.floor(r() * (depth > 1 ? 11 : 13));
  switch (k) {
  case 0: return { type: 'string', maxLength: 1 + Math.floor(r() * 12) };
  case 1: return r() < 0.5 ? { type: 'integer' }
    : { type: 'integer', minimum: -50 + Math.floor(r() * 100), maximum: 100 + Math.floor(r() * 1000) };
  case 2: return { type: 'number' };
  case 3: return { type: 'boolean' };
  case 4: return { enum: ['red', 'green', 'blue', 'x y'].slice(0, 1 + Math.floor(r() * 4)) };
  case 5: return { type: ['string', 'null'], maxLength: 6 };
  case 6: return { const: 'fixed-' + Math.floor(r() * 100) };
  case 7: return { anyOf: [{ type: 'integer', minimum: 0 }, { type: 'string', maxLength: 4 }] };
  case 8: return { type: 'string', format: ['date', 'date-time', 'uuid', 'time'][Math.floor(r() * 4)] };
  case 9: return { type: 'array', items: { type: 'integer' }, minItems: Math.floor(r() * 2), maxItems: 2 + Math.floor(r() * 3) };
  case 10: return { anyOf: [{ type: 'number' }, { type: 'null' }] };
  case 11: return object(r, depth + 1);
  default: return { type: 'array', items: object(r, depth + 1), maxItems: 2 };
  }
}

function object(r, depth = 0) {
  const n = 1 + Math.floor(r() * 4);
  const properties = {};
  const required = [];
  for (let i = 0; i < n; i++) {
    const name = ['id', 'name', 'count', 'tags', 'when', 'score', 'kind', 'note', 'ok'][Math.floor(r() * 9)] + i;
    properties[name] = leaf(r, depth);
    if (r() < 0.7)
      required.push(name);
  }
  return { type: 'object', properties, required, additionalProperties: false };
}

const SCHEMAS = Array.from({ length: 100 }, (_, i) => object(rng(1000 + i)));

async function askSchema(i, temperature) {
  const schema = SCHEMAS[i];
  const r = await openai.chat.completions.create({
    model: TARGET, max_tokens: MAX_TOKENS, temperature, seed: 7 + i,
    messages: [{ role: 'user', content: `Give me an object number ${i}.` }],
    response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
  });
  const text = r.choices[0].message.content;
  let value;
  assert.doesNotThrow(() => { value = JSON.parse(text); }, `schema ${i} at temperature ${temperature}: not JSON: ${text}`);
  const ok = ajv.validate(schema, value);
  assert.ok(ok, `schema ${i} at temperature ${temperature}: ${ajv.errorsText()}\n${JSON.stringify(schema)}\n${text}`);
  assert.equal(r.choices[0].finish_reason, 'stop', `schema ${i}: the output is complete`);
  return r;
}

test('40 schemas alone, temperature 0 and 1: every answer validates', T, async () => {
  for (let i = 0; i < 40; i++)
    await askSchema(i, i % 2);
});

test('40 schemas 8 at once: every answer validates', T, async () => {
  for (let b = 40; b < 80; b += 8)
    await Promise.all(Array.from({ length: 8 }, (_, j) => askSchema(b + j, j % 2)));
});

test('20 schemas with a draft model set, beside drafting requests: every answer validates', T, async () => {
  const r = await http(`${node.url}/instance/${instance}/draft_model`,
    { method: 'PUT', body: { draft_model: DRAFT, num_draft_tokens: 4 } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  for (let b = 80; b < 100; b += 5) {
    const plain = openai.completions.create({ model: TARGET, prompt: 'Hello', max_tokens: 24, temperature: 0,
      ignore_eos: true });
    await Promise.all([...Array.from({ length: 5 }, (_, j) => askSchema(b + j, j % 2)), plain]);
  }
  const off = await http(`${node.url}/instance/${instance}/draft_model`, { method: 'PUT', body: { draft_model: null } });
  assert.equal(off.status, 200, JSON.stringify(off.json));
});

test('json_object with a small max_tokens still ends in a complete object', T, async () => {
  for (const [max, temperature] of [[8, 0], [12, 1], [30, 1], [60, 0]]) {
    const r = await openai.chat.completions.create({ model: TARGET, max_tokens: max, temperature, seed: max,
      messages: [{ role: 'user', content: 'JSON please' }], response_format: { type: 'json_object' } });
    const text = r.choices[0].message.content;
    let v;
    assert.doesNotThrow(() => { v = JSON.parse(text); }, `max_tokens ${max}: ${text}`);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v), text);
    assert.ok(r.usage.completion_tokens <= max);
  }
});

test('Ollama format (json and a schema), streamed and not', T, async () => {
  const schema = SCHEMAS[3];
  for (const stream of [false, true]) {
    const r = await fetch(`${node.url}/api/chat`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: TARGET, stream, format: schema, options: { temperature: 1, seed: 3, num_predict: 300 },
        messages: [{ role: 'user', content: 'hi' }] }) });
    assert.equal(r.status, 200);
    const body = await r.text();
    const text = body.trim().split('\n').map((l) => JSON.parse(l).message?.content ?? '').join('');
    assert.ok(ajv.validate(schema, JSON.parse(text)), `${ajv.errorsText()}: ${text}`);
  }
  const g = await fetch(`${node.url}/api/generate`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: TARGET, stream: false, format: 'json', prompt: 'x', options: { num_predict: 40 } }) });
  const v = JSON.parse((await g.json()).response);
  assert.equal(typeof v, 'object');
});

test('a GBNF grammar on /v1/completions; stop strings still apply', T, async () => {
  const grammar = 'root ::= ("yes" | "no") " " [0-9]{3} "!"\n';
  const r = await openai.completions.create({ model: TARGET, prompt: 'Answer:', max_tokens: 20, temperature: 1,
    seed: 5, grammar });
  assert.match(r.choices[0].text, /^(yes|no) [0-9]{3}!$/);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await openai.completions.create({ model: TARGET, prompt: 'Answer:', max_tokens: 20, temperature: 0,
    grammar: 'root ::= "abc" "def" "ghi"\n', stop: ['e'] });
  assert.equal(s.choices[0].text, 'abcd');
});

test('tool_choice required and named: every call parses and its arguments validate', T, async () => {
  const tools = [0, 1, 2].map((k) => ({ type: 'function',
    function: { name: `tool_${k}`, description: `tool ${k}`, parameters: SCHEMAS[10 + k] } }));
  const ask = async (i) => {
    const named = i % 2 === 1;
    const tool_choice = named ? { type: 'function', function: { name: `tool_${i % 3}` } } : 'required';
    const r = await openai.chat.completions.create({ model: TARGET, max_tokens: MAX_TOKENS, temperature: i % 3 === 0 ? 0 : 1,
      seed: 40 + i, tools, tool_choice, messages: [{ role: 'user', content: `Call a tool (${i}).` }] });
    const calls = r.choices[0].message.tool_calls;
    assert.ok(Array.isArray(calls) && calls.length === 1, `request ${i}: ${JSON.stringify(r.choices[0].message)}`);
    const { name, arguments: args } = calls[0].function;
    const tool = tools.find((t) => t.function.name === name);
    assert.ok(tool, `request ${i}: unknown tool ${name}`);
    if (named)
      assert.equal(name, `tool_${i % 3}`);
    const v = JSON.parse(args);
    assert.ok(ajv.validate(tool.function.parameters, v), `request ${i}: ${ajv.errorsText()}: ${args}`);
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
  };
  for (let b = 0; b < 12; b += 4)
    await Promise.all([0, 1, 2, 3].map((j) => ask(b + j)));
  const bad = await http(`${node.url}/v1/chat/completions`, { body: { model: TARGET, messages: [{ role: 'user', content: 'x' }],
    tools, tool_choice: { type: 'function', function: { name: 'nope' } } } });
  assert.equal(bad.status, 400);
});

test('Anthropic tool_choice any and tool: the answer is a tool_use whose input validates', T, async () => {
  const tools = [0, 1].map((k) => ({ name: `t${k}`, description: 'x', input_schema: SCHEMAS[20 + k] }));
  for (const [i, tool_choice] of [[0, { type: 'any' }], [1, { type: 'tool', name: 't1' }]]) {
    const r = await http(`${node.url}/v1/messages`, { body: { model: TARGET, max_tokens: MAX_TOKENS, temperature: 1,
      tools, tool_choice, messages: [{ role: 'user', content: 'use a tool' }] } });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const use = r.json.content.find((c) => c.type === 'tool_use');
    assert.ok(use, JSON.stringify(r.json));
    const tool = tools.find((t) => t.name === use.name);
    assert.ok(tool && (i === 0 || use.name === 't1'), use.name);
    assert.ok(ajv.validate(tool.input_schema, use.input), `${ajv.errorsText()}: ${JSON.stringify(use.input)}`);
    assert.equal(r.json.stop_reason, 'tool_use');
  }
});

test('unsupported keywords and bad grammars are a 400 naming them', T, async () => {
  const bad = async (body, re) => {
    const r = await http(`${node.url}/v1/chat/completions`, { body: { model: TARGET, messages: [{ role: 'user', content: 'x' }], ...body } });
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(JSON.stringify(r.json), re);
  };
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'a', schema: { type: 'string', pattern: '^a' } } } },
    /unsupported JSON Schema keyword 'pattern'/);
  await bad({ response_format: { type: 'json_schema', json_schema: { name: 'a', schema: { type: 'object',
    properties: { a: { not: { type: 'integer' } } } } } } }, /'not' at properties\.a/);
  await bad({ grammar: 'root ::= root "x" | "y"\n' }, /left recursion/);
});
