// gpt-oss's vocabulary, o200k_harmony, as a GGUF vocabulary file (no tensors) that
// `cairn mkmodel --vocab` copies into a model, made from the o200k_base ranks that the
// js-tiktoken package ships (npm), since the test data has no gpt-oss file:
//   - tokens 0..199997: o200k_base's byte strings in the GPT-2 byte-to-unicode spelling;
//   - 199998..201087: o200k_harmony's special tokens (<|startoftext|>, <|endoftext|>,
//     <|return|>, <|constrain|>, <|channel|>, <|start|>, <|end|>, <|message|>, <|call|>)
//     and <|reserved_N|> for the rest, as openai/gpt-oss-20b's tokenizer lists them;
//   - merges: tiktoken has ranks, not merges. A token of rank r is the merge of the two
//     parts that byte-pair encoding of its own bytes, using only ranks below r, leaves
//     (what converters of tiktoken vocabularies to merges do), ordered by r;
//   - tokenizer.ggml.pre "gpt-4o", as llama.cpp's converter writes for gpt-oss.
//   node tests/e2e/o200k.mjs OUT.gguf
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import o200k from 'js-tiktoken/ranks/o200k_base';

const HARMONY_SPECIAL = {
  199998: '<|startoftext|>', 199999: '<|endoftext|>', 200002: '<|return|>', 200003: '<|constrain|>',
  200005: '<|channel|>', 200006: '<|start|>', 200007: '<|end|>', 200008: '<|message|>', 200012: '<|call|>',
};
export const O200K_VOCAB_SIZE = 201088;

// The ranks as [bytes (latin1 string), rank], from js-tiktoken's compressed form:
// lines of "! FIRST_RANK b64 b64 ...".
export function o200kRanks() {
  const ranks = new Map();
  for (const line of o200k.bpe_ranks.split('\n')) {
    if (!line) continue;
    const [, first, ...toks] = line.split(' ');
    const base = Number.parseInt(first, 10);
    toks.forEach((b64, i) => ranks.set(Buffer.from(b64, 'base64').toString('latin1'), base + i));
  }
  return ranks;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n.
function byteToUnicode() {
  const keep = [];
  for (let b = 33; b <= 126; b++) keep.push(b);
  for (let b = 161; b <= 172; b++) keep.push(b);
  for (let b = 174; b <= 255; b++) keep.push(b);
  const map = new Array(256);
  let n = 0;
  for (let b = 0; b < 256; b++)
    map[b] = String.fromCodePoint(keep.includes(b) ? b : 256 + n++);
  return map;
}

// The two parts a token of rank r is merged from: byte-pair encoding of its bytes with
// the ranks below r, which must end in exactly two parts.
function mergeOf(bytes, rank, ranks) {
  let parts = [...bytes];
  for (;;) {
    let best = -1, bestRank = rank;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = ranks.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank) {
        bestRank = r;
        best = i;
      }
    }
    if (best < 0) break;
    parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
  }
  if (parts.length !== 2) throw new Error(`rank ${rank}: ${parts.length} parts remain`);
  return parts;
}

// ---- a GGUF writer for metadata only ----
class Writer {
  constructor() { this.chunks = []; }
  u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.chunks.push(b); }
  i32(v) { const b = Buffer.alloc(4); b.writeInt32LE(v); this.chunks.push(b); }
  u64(v) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); this.chunks.push(b); }
  str(s) { const b = Buffer.from(s, 'utf8'); this.u64(b.length); this.chunks.push(b); }
  bytes() { return Buffer.concat(this.chunks); }
}
const T_UINT32 = 4, T_INT32 = 5, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9;

export function writeO200kVocab(path) {
  const ranks = o200kRanks();
  const b2u = byteToUnicode();
  const spell = (latin1) => [...latin1].map((c) => b2u[c.charCodeAt(0)]).join('');
  const tokens = new Array(O200K_VOCAB_SIZE), types = new Array(O200K_VOCAB_SIZE).fill(1);
  for (const [bytes, r] of ranks) tokens[r] = spell(bytes);
  for (let id = ranks.size; id < O200K_VOCAB_SIZE; id++) {
    tokens[id] = HARMONY_SPECIAL[id] ?? `<|reserved_${id}|>`;
    types[id] = 3; // control
  }
  if (tokens.some((t) => t === undefined)) throw new Error('o200k ranks leave a gap');
  const merges = [];
  for (const [bytes, r] of [...ranks].sort((a, b) => a[1] - b[1]))
    if (bytes.length >= 2) merges.push(mergeOf(bytes, r, ranks).map(spell).join(' '));

  const w = new Writer();
  const kv = [];
  const kvStr = (k, v) => kv.push(() => { w.str(k); w.u32(T_STRING); w.str(v); });
  const kvU32 = (k, v) => kv.push(() => { w.str(k); w.u32(T_UINT32); w.u32(v); });
  const kvBool = (k, v) => kv.push(() => { w.str(k); w.u32(T_BOOL); w.chunks.push(Buffer.from([v ? 1 : 0])); });
  const kvStrs = (k, arr) => kv.push(() => { w.str(k); w.u32(T_ARRAY); w.u32(T_STRING); w.u64(arr.length); arr.forEach((s) => w.str(s)); });
  const kvI32s = (k, arr) => kv.push(() => { w.str(k); w.u32(T_ARRAY); w.u32(T_INT32); w.u64(arr.length); arr.forEach((v) => w.i32(v)); });
  kvStr('general.architecture', 'gpt-oss');
  kvStr('general.name', 'o200k_harmony vocabulary (from js-tiktoken o200k_base)');
  kvStr('tokenizer.ggml.model', 'gpt2');
  kvStr('tokenizer.ggml.pre', 'gpt-4o');
  kvStrs('tokenizer.ggml.tokens', tokens);
  kvI32s('tokenizer.ggml.token_type', types);
  kvStrs('tokenizer.ggml.merges', merges);
  kvU32('tokenizer.ggml.bos_token_id', 199998);
  kvU32('tokenizer.ggml.eos_token_id', 200002);
  kvU32('tokenizer.ggml.padding_token_id', 199999);
  kvBool('tokenizer.ggml.add_bos_token', false);
  w.chunks.push(Buffer.from('GGUF', 'latin1'));
  w.u32(3);
  w.u64(0);
  w.u64(kv.length);
  kv.forEach((f) => f());
  let out = w.bytes();
  const pad = (32 - (out.length % 32)) % 32;
  if (pad) out = Buffer.concat([out, Buffer.alloc(pad)]);
  fs.writeFileSync(path, out);
  return { tokens: tokens.length, merges: merges.length };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.argv.length !== 3) {
    process.stderr.write('usage: node tests/e2e/o200k.mjs OUT.gguf\n');
    process.exit(2);
  }
  const r = writeO200kVocab(process.argv[2]);
  process.stdout.write(`${process.argv[2]}: ${r.tokens} tokens, ${r.merges} merges\n`);
}
