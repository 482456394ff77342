// Malformed requests over raw HTTP (fetch): each gets a 4xx with an error body in its
// API's format, no generation task fails, and the node keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, http, metric,
  assertStopsCleanly } from './cairn.mjs';

const MODEL = 'qwen-small';
const T = { timeout: 120_000 * SLOW };
let dir, node;

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await makeModel(models, MODEL);
  node = await startNode(dir, models, { expectModels: [MODEL] });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

const user = [{ role: 'user', content: 'Hi' }];
const chat = (extra) => ({ model: MODEL, messages: user, max_tokens: 2, ...extra });
const bytes = (...parts) => Buffer.concat(parts.map((p) => Buffer.from(p)));
const badUtf8 = bytes(`{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":"a`,
  [0xff, 0xfe, 0xc3], '"}]}');
const badUtf8Ollama = bytes(`{"model":"${MODEL}","stream":false,"messages":[{"role":"user","content":"`, [0xc0, 0x80],
  '"}]}');
const badUtf8Prompt = bytes(`{"model":"${MODEL}","max_tokens":2,"prompt":"`, [0xed, 0xa0, 0x80], '"}');
// A chat body whose one message has this JSON text as its content.
const withContent = (json) => `{"model":"${MODEL}","max_tokens":2,"messages":[{"role":"user","content":${json}}]}`;
const deep = '['.repeat(100_000) + ']'.repeat(100_000);

// [what, path, body (object: sent as JSON; string or bytes: sent as is), method]
const OPENAI = [
  ['bad JSON', '/v1/chat/completions', '{"model": "qwen-small", "messages": ['],
  ['empty body', '/v1/chat/completions', ''],
  ['body is an array', '/v1/chat/completions', '[1, 2, 3]'],
  ['deeply nested JSON', '/v1/chat/completions', deep],
  ['missing model', '/v1/chat/completions', { messages: user, max_tokens: 2 }],
  ['model is a number', '/v1/chat/completions', chat({ model: 7 })],
  ['missing messages', '/v1/chat/completions', { model: MODEL, max_tokens: 2 }],
  ['messages is a string', '/v1/chat/completions', chat({ messages: 'Hi' })],
  ['messages is empty', '/v1/chat/completions', chat({ messages: [] })],
  ['message is a number', '/v1/chat/completions', chat({ messages: [5] })],
  ['unknown role', '/v1/chat/completions', chat({ messages: [{ role: 'wizard', content: 'Hi' }] })],
  ['content is a number', '/v1/chat/completions', chat({ messages: [{ role: 'user', content: 5 }] })],
  ['content part of unknown type', '/v1/chat/completions',
    chat({ messages: [{ role: 'user', content: [{ type: 'hologram', data: 'x' }] }] })],
  ['max_tokens is a string', '/v1/chat/completions', chat({ max_tokens: 'many' })],
  ['negative max_tokens', '/v1/chat/completions', chat({ max_tokens: -3 })],
  ['fractional max_tokens', '/v1/chat/completions', chat({ max_tokens: 2.5 })],
  ['huge max_tokens', '/v1/chat/completions', chat({ max_tokens: 1e30 })],
  ['huge n', '/v1/chat/completions', chat({ n: 1_000_000 })],
  ['zero n', '/v1/chat/completions', chat({ n: 0 })],
  ['temperature is a string', '/v1/chat/completions', chat({ temperature: 'hot' })],
  ['negative temperature', '/v1/chat/completions', chat({ temperature: -1 })],
  ['top_p above 1', '/v1/chat/completions', chat({ top_p: 1.5 })],
  ['stream is a string', '/v1/chat/completions', chat({ stream: 'yes' })],
  ['stop is a number', '/v1/chat/completions', chat({ stop: 5 })],
  ['tools is an object', '/v1/chat/completions', chat({ tools: { name: 'x' } })],
  ['tool without a function', '/v1/chat/completions', chat({ tools: [{ type: 'function' }] })],
  ['invalid UTF-8 bytes', '/v1/chat/completions', badUtf8],
  ['lone surrogate escape', '/v1/chat/completions', withContent('"\\ud800"')],
  ['NUL escape', '/v1/chat/completions', withContent('"a\\u0000b"')],
  ['completions: missing prompt', '/v1/completions', { model: MODEL, max_tokens: 2 }],
  ['completions: prompt is a number', '/v1/completions', { model: MODEL, prompt: 42, max_tokens: 2 }],
  ['completions: negative max_tokens', '/v1/completions', { model: MODEL, prompt: 'x', max_tokens: -1 }],
  ['completions: invalid UTF-8 bytes', '/v1/completions', badUtf8Prompt],
];
const ANTHROPIC = [
  ['bad JSON', '/v1/messages', '{"model": '],
  ['missing model', '/v1/messages', { messages: user, max_tokens: 2 }],
  ['missing max_tokens', '/v1/messages', { model: MODEL, messages: user }],
  ['negative max_tokens', '/v1/messages', { model: MODEL, messages: user, max_tokens: -1 }],
  ['system role in messages', '/v1/messages', { model: MODEL, messages: [{ role: 'system', content: 'x' }],
    max_tokens: 2 }],
  ['unknown role', '/v1/messages', { model: MODEL, messages: [{ role: 'wizard', content: 'x' }], max_tokens: 2 }],
  ['unknown content block', '/v1/messages', { model: MODEL, max_tokens: 2,
    messages: [{ role: 'user', content: [{ type: 'hologram' }] }] }],
  ['stop_sequences is a string', '/v1/messages', { model: MODEL, messages: user, max_tokens: 2,
    stop_sequences: 'x' }],
  ['invalid UTF-8 bytes', '/v1/messages', badUtf8],
];
const OLLAMA = [
  ['chat: bad JSON', '/api/chat', '{"model"'],
  ['chat: missing model', '/api/chat', { messages: user, stream: false }],
  ['chat: messages is a string', '/api/chat', { model: MODEL, messages: 'Hi', stream: false }],
  ['chat: unknown role', '/api/chat', { model: MODEL, messages: [{ role: 'wizard', content: 'x' }], stream: false }],
  ['chat: options is a string', '/api/chat', { model: MODEL, messages: user, stream: false, options: 'fast' }],
  ['chat: num_predict is a string', '/api/chat', { model: MODEL, messages: user, stream: false,
    options: { num_predict: 'x' } }],
  ['chat: invalid UTF-8 bytes', '/api/chat', badUtf8Ollama],
  ['generate: prompt is a number', '/api/generate', { model: MODEL, prompt: 5, stream: false }],
  ['generate: missing model', '/api/generate', { prompt: 'x', stream: false }],
  ['show: missing model', '/api/show', {}],
];

/** Sends each case; every case runs, and the failures are reported together. */
async function table(cases, check) {
  const failures = [];
  for (const [what, url, body] of cases) {
    try {
      const r = await http(`${node.url}${url}`, { body });
      assert.ok(r.status >= 400 && r.status < 500, `status ${r.status}: ${r.text.slice(0, 300)}`);
      assert.ok(r.json, `the error is not JSON: ${r.text.slice(0, 300)}`);
      check(r.json);
    } catch (e) {
      failures.push(`${url} ${what}: ${e.message}`);
    }
  }
  assert.deepEqual(failures, []);
}

test('a good request first (places the model)', T, async () => {
  const r = await http(`${node.url}/v1/chat/completions`, { body: chat({ temperature: 0 }) });
  assert.equal(r.status, 200, r.text);
});

test('OpenAI endpoints: 4xx with an OpenAI error object', T, async () => {
  await table(OPENAI, (j) => {
    assert.equal(typeof j.error?.message, 'string', JSON.stringify(j));
    assert.equal(typeof j.error?.type, 'string', JSON.stringify(j));
  });
});

test('Anthropic endpoint: 4xx with an Anthropic error object', T, async () => {
  await table(ANTHROPIC, (j) => {
    assert.equal(j.type, 'error', JSON.stringify(j));
    assert.equal(typeof j.error?.type, 'string', JSON.stringify(j));
    assert.equal(typeof j.error?.message, 'string', JSON.stringify(j));
  });
});

test('Ollama endpoints: 4xx with an Ollama error', T, async () => {
  await table(OLLAMA, (j) => assert.equal(typeof j.error, 'string', JSON.stringify(j)));
});

test('wrong methods and paths: 4xx', T, async () => {
  for (const [method, url] of [['GET', '/v1/chat/completions'], ['PUT', '/v1/messages'], ['DELETE', '/api/chat'],
    ['GET', '/v1/no-such-endpoint'], ['POST', '/api/no-such-endpoint']]) {
    const r = await http(`${node.url}${url}`, { method, body: method === 'GET' ? undefined : '{}' });
    assert.ok(r.status >= 400 && r.status < 500, `${method} ${url}: ${r.status}`);
  }
});

test('an Ollama endpoint cairn lacks answers in Ollama\'s error shape', T,
async () => {
  const r = await http(`${node.url}/api/push`, { body: { model: MODEL } });
  assert.ok(r.status >= 400 && r.status < 500, `status ${r.status}`);
  assert.equal(typeof r.json?.error, 'string', r.text);
});

test('the node is healthy and serving after all of them', T, async () => {
  const h = await http(`${node.url}/health`, { method: 'GET' });
  assert.equal(h.status, 200, h.text);
  assert.equal(await metric(node, 'cairn_requests_total{outcome="failed"}'), 0, 'no task failed');
  assert.equal(await metric(node, 'cairn_requests_running'), 0);
  for (const [url, body] of [['/v1/chat/completions', chat({ temperature: 0 })],
    ['/v1/messages', chat({ temperature: 0 })],
    ['/api/chat', { model: MODEL, messages: user, stream: false, options: { num_predict: 2 } }]]) {
    const r = await http(`${node.url}${url}`, { body });
    assert.equal(r.status, 200, `${url}: ${r.text}`);
  }
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
