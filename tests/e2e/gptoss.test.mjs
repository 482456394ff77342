// Serving gpt-oss (issue 19) through `cairn node`: mkmodel's gpt-oss-tiny (attention sinks,
// biases, 8 experts of which 4 per token, every other layer sliding over 24 positions, YaRN)
// with its own harmony template and the Qwen2 vocabulary extended with the harmony tokens.
// The greedy answers of a random model are the same alone and with all requests at once
// (continuous batching mixes their prefills and decodes; one prompt is far longer than the
// window and than a prefill chunk), and the same as `cairn generate`. Script models of the
// same architecture and template, whose greedy output after the generation prompt
// ("<|start|>assistant") is a harmony message, show the channels mapped: analysis to
// reasoning_content, final to content, no marker reaching the client. With a draft of its
// first two layers (a gpt-oss model too: sinks, experts, one sliding layer), speculative
// decoding keeps every answer, alone and all at once, and drafts tokens.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, QWEN_VOCAB, makeTempDir, removeTempDir, startNode, runCairn, assertStopsCleanly,
  assertDraftKeepsAnswers } from './cairn.mjs';

const MODEL = 'gpt-oss-tiny';
const DRAFT = 'gpt-oss-tiny-draft';
const MAX = 24;
const T = { timeout: 300_000 * SLOW };
const REASONING = 'The user wants a greeting.', ANSWER = 'Hello there, friend!';
const LONG = Array.from({ length: 60 }, (_, i) => `Line ${i}: the tide comes in over the sand and goes out again.`)
  .join(' ');
const PROMPTS = ['Hello', 'Why is the sky blue? Explain it to a child in a few short sentences.', 'List three colors',
  'Write a haiku about rain.', LONG];
let dir, models, modelPath, node, openai;
const alone = [], aloneChat = [];

async function mkmodel(name, extra = []) {
  const out = path.join(models, `${name}.gguf`);
  const r = await runCairn(['mkmodel', '--shape', 'gpt-oss-tiny', '--type', 'f16', '--vocab', QWEN_VOCAB, ...extra,
    '-o', out]);
  assert.equal(r.code, 0, r.stderr.toString());
  return out;
}

// Ids of segments in the model's vocabulary (the harmony markers are its control tokens).
async function ids(segments) {
  const out = [];
  for (const s of segments) {
    const r = await runCairn(['tokenize', '-m', modelPath, '--special', '--no-bos', '--ids', s]);
    assert.equal(r.code, 0, r.stderr.toString());
    out.push(...r.stdout.toString().trim().split(/\s+/).map(Number));
  }
  return out;
}

before(async () => {
  dir = makeTempDir();
  models = path.join(dir, 'models');
  fs.mkdirSync(models, { recursive: true });
  modelPath = await mkmodel(MODEL);
  assert.deepEqual(await ids(['<|start|>', '<|channel|>', '<|call|>']), [151936, 151939, 151942],
    'the harmony markers follow the Qwen2 vocabulary');
  await mkmodel('oss-think', ['--script-ids', (await ids(['assistant', '<|channel|>', 'analysis', '<|message|>',
    REASONING, '<|end|>', '<|return|>'])).join(',')]);
  await mkmodel('oss-answer', ['--script-ids', (await ids(['assistant', '<|channel|>', 'final', '<|message|>',
    ANSWER, '<|return|>'])).join(',')]);
  const d = await runCairn(['mkmodel', '--draft-of', modelPath, '--layers', '2', '-o',
    path.join(models, `${DRAFT}.gguf`)]);
  assert.equal(d.code, 0, d.stderr.toString());
  node = await startNode(dir, models, { parallel: 8, expectModels: [MODEL, DRAFT, 'oss-think', 'oss-answer'] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

async function complete(prompt, usage = false) {
  const r = await openai.completions.create({ model: MODEL, prompt, max_tokens: MAX, temperature: 0,
    ignore_eos: true });
  assert.equal(r.usage.completion_tokens, MAX);
  const got = { text: r.choices[0].text, prompt: r.usage.prompt_tokens };
  return usage ? { ...got, drafted: r.usage.draft_tokens ?? 0 } : got;
}

async function chat(content) {
  const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content }],
    max_tokens: MAX, temperature: 0 });
  const m = r.choices[0].message;
  return { content: m.content ?? '', reasoning: m.reasoning_content ?? '' };
}

test('each prompt alone, some far past the sliding window', T, async () => {
  for (const p of PROMPTS) {
    alone.push(await complete(p));
    aloneChat.push(await chat(p));
  }
  assert.ok(alone.at(-1).prompt > 600, `the long prompt has ${alone.at(-1).prompt} tokens`);
  assert.ok(new Set(alone.map((a) => a.text)).size >= 2, `distinct answers: ${JSON.stringify(alone)}`);
  // a random model writes no channel header: its text comes back as content
  assert.ok(new Set(aloneChat.map((c) => c.content)).size >= 2, `distinct chats: ${JSON.stringify(aloneChat)}`);
  for (const c of [...alone.map((a) => a.text), ...aloneChat.flatMap((c) => [c.content, c.reasoning])])
    assert.ok(!c.includes('<|start|>') && !c.includes('<|channel|>'), `no harmony marker in ${JSON.stringify(c)}`);
});

test('the same answers with all requests at once', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const [texts, chats] = await Promise.all([Promise.all(PROMPTS.map((p) => complete(p))),
    Promise.all(PROMPTS.map(chat))]);
  assert.deepEqual(texts, alone);
  assert.deepEqual(chats, aloneChat);
});

test('the same answer from cairn generate', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const r = await runCairn(['generate', '-m', modelPath, '-p', PROMPTS[1], '-n', String(MAX), '--temp', '0',
    '--ignore-eos', '-t', '1']);
  assert.equal(r.code, 0, r.stderr.toString());
  assert.equal(r.stdout.toString().replace(/\n$/, ''), alone[1].text);
});

// Speculation on a mixture of experts: the target verifies K+1 tokens per step in one
// batched forward, whose experts are grouped over those tokens; every answer must still be
// the plain one, past the sliding window too.
test('a draft of its first two layers: the same answers, drafted tokens counted', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  await assertDraftKeepsAnswers(node, MODEL, DRAFT, PROMPTS, alone, complete);
});

test('harmony channels: analysis is reasoning_content, final is content', T, async () => {
  const hi = [{ role: 'user', content: 'Say hello.' }];
  const think = await openai.chat.completions.create({ model: 'oss-think', messages: hi, max_tokens: 64,
    temperature: 0 });
  assert.equal(think.choices[0].message.reasoning_content, REASONING);
  assert.equal(think.choices[0].message.content ?? '', '');
  const answer = await openai.chat.completions.create({ model: 'oss-answer', messages: hi, max_tokens: 64,
    temperature: 0 });
  assert.equal(answer.choices[0].message.content, ANSWER);
  assert.equal(answer.choices[0].message.reasoning_content ?? '', '');
  assert.equal(answer.choices[0].finish_reason, 'stop');
  // streamed, the same
  const s = await openai.chat.completions.create({ model: 'oss-think', messages: hi, max_tokens: 64,
    temperature: 0, stream: true });
  let reasoning = '', content = '';
  for await (const chunk of s)
    for (const ch of chunk.choices) {
      reasoning += ch.delta.reasoning_content ?? '';
      content += ch.delta.content ?? '';
    }
  assert.equal(reasoning, REASONING);
  assert.equal(content, '');
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(node);
});
