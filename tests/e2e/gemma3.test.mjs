// Serving gemma3 (sliding-window layers) through `cairn node`: the greedy answer to each
// chat, some much longer than gemma3-tiny's window of 24 positions, is the same alone, with
// all of them at once (continuous batching mixes their prefills and decodes), and from
// `cairn generate --chat`, which renders the model's own Gemma template and decodes one
// sequence, and with a draft of its first two layers; the rendered prompt uses Gemma's turns.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { SLOW, SHARED, makeTempDir, removeTempDir, startNode, runCairn, http, assertStopsCleanly,
  assertDraftKeepsAnswers } from './cairn.mjs';

const MODEL = 'gemma3-tiny';
const DRAFT = 'gemma3-tiny-draft';
const MAX = 24;
const T = { timeout: 240_000 * SLOW };
const PROMPTS = [
  'Hello',
  'Why is the sky blue? Explain it to a child in a few short sentences, with an example from the seaside.',
  'Write a long letter to an old friend about the harbour town, its fishing boats, the storms of winter, '
    + 'the lighthouse on the cliff and the bakery that opens before dawn, and ask about their garden.',
  'List three colors',
];
let dir, modelPath, node;
const alone = [];

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  modelPath = path.join(models, `${MODEL}.gguf`);
  (await import('node:fs')).mkdirSync(models, { recursive: true });
  const r = await runCairn(['mkmodel', '--shape', MODEL, '--type', 'q8_0', '--vocab',
    path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-spm.gguf'), '-o', modelPath]);
  assert.equal(r.code, 0, r.stderr);
  const d = await runCairn(['mkmodel', '--draft-of', modelPath, '--layers', '2', '-o',
    path.join(models, `${DRAFT}.gguf`)]);
  assert.equal(d.code, 0, d.stderr);
  node = await startNode(dir, models, { parallel: 4, expectModels: [MODEL, DRAFT] });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

async function ask(content, usage = false) {
  const r = await http(`${node.url}/v1/chat/completions`, {
    body: { model: MODEL, messages: [{ role: 'user', content }], max_tokens: MAX, temperature: 0 },
    timeoutMs: 120_000 * SLOW,
  });
  assert.equal(r.status, 200, r.text);
  const u = r.json.usage;
  assert.equal(u.completion_tokens, MAX, 'a random model runs to max_tokens');
  const got = { text: r.json.choices[0].message.content, prompt: u.prompt_tokens };
  return usage ? { ...got, drafted: u.draft_tokens ?? 0 } : got;
}

test('each chat alone, with prompts past the sliding window', T, async () => {
  for (const p of PROMPTS)
    alone.push(await ask(p));
  assert.ok(alone.some((a) => a.prompt + MAX > 2 * 24), 'some sequences run past the window');
  assert.ok(new Set(alone.map((a) => a.text)).size >= 2, `distinct answers: ${JSON.stringify(alone)}`);
});

test('the same answers with all chats at once', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  const together = await Promise.all(PROMPTS.map((p) => ask(p)));
  assert.deepEqual(together, alone);
});

test('the same answers from cairn generate --chat', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  for (let i = 0; i < PROMPTS.length; i++) {
    const r = await runCairn(['generate', '-m', modelPath, '--chat', PROMPTS[i], '-n', String(MAX), '--temp', '0']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.toString().replace(/\n$/, ''), alone[i].text, `prompt ${i}`); // the CLI ends with a newline
  }
});

// A draft of gemma3's first two layers (one of them sliding): speculation keeps every
// answer, past the window too, and drafts tokens.
test('a draft of its first two layers: the same answers, drafted tokens counted', T, async (t) => {
  if (alone.length !== PROMPTS.length)
    return t.skip('no answers alone');
  await assertDraftKeepsAnswers(node, MODEL, DRAFT, PROMPTS, alone, ask);
});

test("the model's Gemma template renders the turns", T, async () => {
  const msgs = path.join(dir, 'messages.json');
  const fs = await import('node:fs');
  fs.writeFileSync(msgs, JSON.stringify([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }]));
  const r = await runCairn(['template', '-m', modelPath, '--messages', msgs, '--add-generation-prompt']);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.toString(), '<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n');
});

test('stops cleanly', T, async () => {
  await assertStopsCleanly(node);
  node = null;
});
