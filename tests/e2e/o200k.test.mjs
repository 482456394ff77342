// gpt-oss's own vocabulary (issue 19): o200k_harmony written as a GGUF vocabulary from
// js-tiktoken's o200k_base ranks (o200k.mjs). cairn's tokenizer gives tiktoken's ids for
// the same text (a fixed corpus and seeded random texts over many scripts, marks, digits,
// contractions, whitespace); the harmony markers sit at their real ids; a gpt-oss-tiny
// model on this vocabulary serves through `cairn node`, counts its prompt as tiktoken
// does, and maps a harmony answer written in o200k ids to content and reasoning_content.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { Tiktoken } from 'js-tiktoken/lite';
import o200kBase from 'js-tiktoken/ranks/o200k_base';
import { SLOW, makeTempDir, removeTempDir, startNode, runCairn } from './cairn.mjs';
import { writeO200kVocab, O200K_VOCAB_SIZE } from './o200k.mjs';

const T = { timeout: 300_000 * SLOW };
const tiktoken = new Tiktoken(o200kBase);
let dir, vocab, models, node, openai;

const CORPUS = [
  'Hello world! It\'s 12345 tokens, café ÉCOLE naïve 東京 😀',
  'I\'M SURE THEY\'LL SAY WE\'VE DONE IT; don\'t you\'d?',
  'def f(x):\n    return x * 2  # doubled\n\n\n\tindented\r\nwindows',
  'Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. 안녕하세요 세계',
  'numbers 1 12 123 1234 12345678901234567890 3.14159 -42 1e10 0x1F',
  'e\u0301 n\u0303 a\u0308\'s Ǆǅǆ ǈ ʰʲ İstanbul ıi ẞß',
  '   leading and trailing spaces   ',
  'emoji 👍🏽👨‍👩‍👧 flags 🇯🇵 keycap 1️⃣',
  'https://example.com/path?q=1&r=two#frag <tag attr="v">text</tag>',
  '',
];

function randomTexts(n, seed) {
  const pool = [...'aAbBzZ éÉèÈßẞİıçÇ ǅǈ ʰʲ 東京日本語한국어 Привет ΑΒΓαβγ \u0301\u0308 😀👍🏽 0123456789 ' +
    '\'s\'S\'T\'re\'VE\'ll .,;:!?()[]{}<>/\\|-_=+*&^%$#@~`" \t\n\r  '];
  let s = BigInt(seed);
  const rnd = (k) => {
    s = (s * 6364136223846793005n + 1442695040888963407n) & ((1n << 64n) - 1n);
    return Number((s >> 33n) % BigInt(k));
  };
  return Array.from({ length: n }, () => Array.from({ length: 1 + rnd(60) }, () => pool[rnd(pool.length)]).join(''));
}

async function cairnIds(text, { special = false, model = vocab } = {}) {
  const f = path.join(dir, 'text.txt');
  fs.writeFileSync(f, text);
  const r = await runCairn(['tokenize', '-m', model, '--ids', '--no-bos', ...(special ? ['--special'] : []),
    '--file', f]);
  assert.equal(r.code, 0, r.stderr.toString());
  const out = r.stdout.toString().trim();
  return out ? out.split(/\s+/).map(Number) : [];
}

before(async () => {
  dir = makeTempDir();
  vocab = path.join(dir, 'o200k.gguf');
  const made = writeO200kVocab(vocab);
  assert.equal(made.tokens, O200K_VOCAB_SIZE);
  assert.equal(made.merges, 199998 - 256); // every token of two bytes or more is one merge
  models = path.join(dir, 'models');
  fs.mkdirSync(models, { recursive: true });
});

after(async () => {
  await node?.stop();
  removeTempDir(dir);
});

test('the tokenizer gives tiktoken\'s ids', T, async () => {
  // one run over all texts: a control token between them splits the text into pieces
  // that are tokenized apart, as each text alone
  const texts = [...CORPUS, ...randomTexts(400, 7)];
  const all = await cairnIds(texts.join('<|endoftext|>'), { special: true });
  const pieces = [[]];
  for (const id of all)
    if (id === 199999)
      pieces.push([]);
    else
      pieces.at(-1).push(id);
  assert.equal(pieces.length, texts.length);
  texts.forEach((text, i) => assert.deepEqual(pieces[i], tiktoken.encode(text), `text ${JSON.stringify(text)}`));
  // and a few alone
  for (const text of CORPUS.slice(0, 3))
    assert.deepEqual(await cairnIds(text), tiktoken.encode(text));
});

test('the harmony markers are control tokens at their o200k_harmony ids', T, async () => {
  assert.deepEqual(await cairnIds('<|start|>assistant<|channel|>final<|message|>Hi<|end|><|return|><|call|>',
    { special: true }), [200006, 173781, 200005, 17196, 200008, 12194, 200007, 200002, 200012]);
  // without --special: <|start|>, <|channel|>, <|message|> and <|constrain|> are still parsed
  // (llama.cpp's rule for gpt-oss, so that a rendered conversation keeps them); the others,
  // like <|endoftext|> and <|return|>, are text, as tiktoken encodes them
  assert.deepEqual(await cairnIds('<|start|><|message|>'), [200006, 200008]);
  for (const text of ['<|endoftext|>', '<|return|>', 'a<|call|>b'])
    assert.deepEqual(await cairnIds(text), tiktoken.encode(text, [], []), text);
});

test('gpt-oss-tiny on o200k serves, counts prompts as tiktoken does and maps harmony channels', T, async () => {
  const mk = async (name, extra = []) => {
    const r = await runCairn(['mkmodel', '--shape', 'gpt-oss-tiny', '--type', 'f16', '--vocab', vocab, ...extra,
      '-o', path.join(models, `${name}.gguf`)]);
    assert.equal(r.code, 0, r.stderr.toString());
  };
  await mk('oss-o200k');
  const answer = 'Hello there, friend!';
  const script = [];
  for (const s of ['assistant', '<|channel|>', 'final', '<|message|>', answer, '<|return|>'])
    script.push(...await cairnIds(s, { special: true }));
  await mk('oss-o200k-answer', ['--script-ids', script.join(',')]);
  // the model file keeps the vocabulary whole: no harmony token appended twice
  assert.equal((await cairnIds('<|call|>', { special: true, model: path.join(models, 'oss-o200k.gguf') }))[0], 200012);
  node = await startNode(dir, models, { expectModels: ['oss-o200k', 'oss-o200k-answer'] });
  openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120_000 * SLOW });
  const prompt = 'The quick brown fox jumps over the lazy dog. Ünïcödé, 東京, 12345!';
  const r = await openai.completions.create({ model: 'oss-o200k', prompt, max_tokens: 8, temperature: 0,
    ignore_eos: true });
  assert.equal(r.usage.prompt_tokens, tiktoken.encode(prompt).length);
  assert.equal(r.usage.completion_tokens, 8);
  const c = await openai.chat.completions.create({ model: 'oss-o200k-answer',
    messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 64, temperature: 0 });
  assert.equal(c.choices[0].message.content, answer);
  assert.equal(c.choices[0].message.reasoning_content ?? '', '');
  assert.equal(c.choices[0].finish_reason, 'stop');
});
