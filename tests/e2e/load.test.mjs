// Clients that go away and clients that come all at once. A stream aborted mid-way by its
// client (each SDK's own abort), or a whole answer given up, is cancelled on the node, the streams beside it finish
// unchanged, and the slots come back; 64 clients at once against --parallel 8 each get an
// answer or a refusal (503; 529 overloaded_error on the Anthropic API, as Anthropic does),
// none hangs, and the node serves normally afterwards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, http, metric, within, sleep,
  assertStopsCleanly } from './cairn.mjs';

const MODEL = 'qwen-small';
const T = { timeout: 300_000 * SLOW };
let dir, node, openai, anthropic, ollama;

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await makeModel(models, MODEL);
  // 64 clients at once from one address is the API's default limit of open connections per
  // client address (--api-max-per-client); this process also keeps idle connections of
  // its own (fetch's pool), which would push the 64 past it: the limit is raised a little.
  node = await startNode(dir, models, { parallel: 8, expectModels: [MODEL], args: ['--api-max-per-client', '96'] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
  anthropic = new Anthropic({ baseURL: node.url, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
  ollama = new Ollama({ host: node.url });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

const LONG = 300; // tokens: long enough that an abort after the first chunk is mid-stream
const msg = (content) => [{ role: 'user', content }];

/** Polls /metrics until ok(values) or the bound; returns the last values. */
async function waitMetrics(ok, ms = 30_000 * SLOW) {
  const until = Date.now() + ms;
  for (;;) {
    const v = {
      cancelled: await metric(node, 'cairn_requests_total{outcome="cancelled"}'),
      running: await metric(node, 'cairn_requests_running'),
      queued: await metric(node, 'cairn_requests_queued'),
    };
    if (ok(v) || Date.now() > until)
      return v;
    await sleep(100);
  }
}

test('aborted requests are cancelled; the streams beside them are unaffected', T, async () => {
  // The survivor's answer alone first, to compare with its answer beside the aborts.
  const survivorBody = { model: MODEL, messages: msg('Keep talking about rivers.'), max_tokens: 40, temperature: 0 };
  const alone = (await openai.chat.completions.create(survivorBody)).choices[0].message.content;
  const before = await waitMetrics((v) => v.running === 0);
  assert.equal(before.running, 0);

  let firstChunks = 0;
  const gotChunk = () => { firstChunks++; };

  // OpenAI: an AbortController's signal in the request options.
  const oaAbort = new AbortController();
  const oaDone = (async () => {
    const s = await openai.chat.completions.create({ model: MODEL, messages: msg('Talk about mountains.'),
      max_tokens: LONG, temperature: 0, stream: true }, { signal: oaAbort.signal });
    let n = 0;
    try {
      for await (const chunk of s) {
        if (chunk.choices[0]?.delta?.content && n++ === 0) {
          gotChunk();
          oaAbort.abort();
        }
      }
    } catch (e) {
      return { error: e.name, n };
    }
    return { error: null, n }; // this SDK ends an aborted stream's loop quietly
  })();

  // Anthropic: the same, through messages.create with stream: true.
  const anAbort = new AbortController();
  const anDone = (async () => {
    const s = await anthropic.messages.create({ model: MODEL, messages: msg('Talk about forests.'), max_tokens: LONG,
      temperature: 0, stream: true }, { signal: anAbort.signal });
    let n = 0;
    try {
      for await (const ev of s) {
        if (ev.type === 'content_block_delta' && n++ === 0) {
          gotChunk();
          anAbort.abort();
        }
      }
    } catch (e) {
      return { error: e.name, n };
    }
    return { error: null, n };
  })();

  // Ollama: the stream's own abort().
  const olDone = (async () => {
    const s = await ollama.chat({ model: MODEL, messages: msg('Talk about deserts.'), stream: true,
      options: { temperature: 0, num_predict: LONG } });
    let n = 0;
    try {
      for await (const part of s) {
        if (part.message.content && n++ === 0) {
          gotChunk();
          s.abort();
        }
      }
    } catch (e) {
      return { error: e.name, n };
    }
    return { error: null, n };
  })();

  // A whole (not streamed) answer whose client gives up: aborted once the streams above
  // have started, so that it is generating too. This small model writes thousands of tokens
  // a second on a fast machine, so the answer asked for is long and may not end early
  // (ignore_eos): it is still being written when the abort comes (it failed once in CI
  // with max_tokens 300, answered before the abort).
  const wholeAbort = new AbortController();
  const wholeDone = openai.chat.completions.create({ model: MODEL, messages: msg('Talk about oceans.'),
    max_tokens: 3500, ignore_eos: true, temperature: 0 }, { signal: wholeAbort.signal })
    .then(() => 'answered', (e) => e.constructor.name);
  (async () => {
    while (firstChunks < 3)
      await sleep(20);
    await sleep(200);
    wholeAbort.abort();
  })();

  const survivor = openai.chat.completions.create({ ...survivorBody, stream: true }).then(async (s) => {
    let text = '', finish = null;
    for await (const chunk of s) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    return { text, finish };
  });

  const [oa, an, ol, sv, whole] = await within(120_000 * SLOW,
    Promise.all([oaDone, anDone, olDone, survivor, wholeDone]), 'the streams');
  assert.equal(firstChunks, 3, 'each aborted stream had started');
  // Each loop ended long before the LONG tokens asked for (a few chunks may have been in
  // flight), quietly (OpenAI, Anthropic) or with the SDK's abort error (Ollama).
  for (const [name, r] of [['OpenAI', oa], ['Anthropic', an], ['Ollama', ol]]) {
    assert.ok(r.n < LONG / 4, `${name}: ${r.n} chunks after the abort`);
    assert.ok(r.error === null || /Abort/.test(r.error), `${name}: ${r.error}`);
  }
  assert.equal(whole, 'APIUserAbortError', 'the whole answer was aborted');
  assert.equal(sv.text, alone, 'the survivor\'s answer is the one it gets alone');
  assert.ok(sv.finish === 'length' || sv.finish === 'stop');

  // The node notices the four disconnects, cancels them and frees their slots.
  const v = await waitMetrics((m) => m.cancelled >= before.cancelled + 4 && m.running === 0);
  assert.equal(v.cancelled, before.cancelled + 4, 'cancelled');
  assert.equal(v.running, 0);
  assert.equal(v.queued, 0);

  // All 8 slots serve again: 8 requests at once complete.
  const again = await within(120_000 * SLOW, Promise.all(Array.from({ length: 8 }, (_, i) =>
    openai.chat.completions.create({ model: MODEL, messages: msg(`Number ${i}`), max_tokens: 4, temperature: 0 }))),
  'the requests after the aborts');
  for (const r of again)
    assert.equal(r.choices.length, 1);
});

test('64 clients at once against --parallel 8: each gets an answer or a refusal', T, async () => {
  const N = 64;
  const outcome = async (i) => {
    const content = `Client ${i} says hello.`;
    try {
      switch (i % 4) {
      case 0: {
        const r = await openai.chat.completions.create({ model: MODEL, messages: msg(content), max_tokens: 4,
          temperature: 0 });
        assert.ok(r.choices[0].finish_reason);
        return 'ok';
      }
      case 1: {
        const s = await openai.chat.completions.create({ model: MODEL, messages: msg(content), max_tokens: 4,
          temperature: 0, stream: true });
        let finish = null;
        for await (const chunk of s)
          finish = chunk.choices[0]?.finish_reason ?? finish;
        assert.ok(finish, 'the stream finished');
        return 'ok';
      }
      case 2: {
        const r = await anthropic.messages.create({ model: MODEL, messages: msg(content), max_tokens: 4,
          temperature: 0 });
        assert.ok(r.stop_reason);
        return 'ok';
      }
      default: {
        const r = await http(`${node.url}/api/chat`, { body: { model: MODEL, messages: msg(content), stream: false,
          options: { num_predict: 4, temperature: 0 } } });
        if (r.status === 503) {
          assert.equal(typeof r.json?.error, 'string', r.text);
          return 503;
        }
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.done, true);
        return 'ok';
      }
      }
    } catch (e) {
      if (e.status === 503 || (e.status === 529 && e instanceof Anthropic.APIError))
        return 503;
      throw e;
    }
  };
  const results = await within(240_000 * SLOW, Promise.all(Array.from({ length: N }, (_, i) => outcome(i))),
    '64 concurrent requests');
  const ok = results.filter((r) => r === 'ok').length;
  const refused = results.filter((r) => r === 503).length;
  console.log(`64 clients: ${ok} answered, ${refused} refused`);
  assert.equal(ok + refused, N);
  assert.ok(ok >= 8, `at least a batch answered (${ok})`);

  const v = await waitMetrics((m) => m.running === 0 && m.queued === 0);
  assert.equal(v.running, 0);
  assert.equal(v.queued, 0);
  const health = await http(`${node.url}/health`, { method: 'GET' });
  assert.equal(health.status, 200, health.text);
  const r = await openai.chat.completions.create({ model: MODEL, messages: msg('Still there?'), max_tokens: 4,
    temperature: 0 });
  assert.equal(r.usage.completion_tokens <= 4 && r.usage.completion_tokens > 0, true);
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
