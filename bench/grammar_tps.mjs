// Decode speed with a JSON Schema against without, at 1 and 8 streams, through a real
// `cairn node` (OpenAI /v1/completions, greedy, a short prompt so that decoding
// dominates). Runs alternate (plain, schema, schema, plain, ...) so that a busy machine
// weighs on both alike; prints each run and the medians.
//   node bench/grammar_tps.mjs MODEL.gguf [TOKENS=48] [REPS=3] [THREADS=2]
import path from 'node:path';
import fs from 'node:fs';
import { makeTempDir, removeTempDir, startNode, http } from '../tests/e2e/cairn.mjs';

const [model, tokensArg, repsArg, threadsArg] = process.argv.slice(2);
if (!model) {
  console.error('usage: node bench/grammar_tps.mjs MODEL.gguf [TOKENS] [REPS] [THREADS]');
  process.exit(2);
}
const TOKENS = Number(tokensArg || 48), REPS = Number(repsArg || 3), THREADS = threadsArg || '2';
const SCHEMA = { type: 'object', properties: { title: { type: 'string' }, notes: { type: 'array', items: { type: 'string' } },
  n: { type: 'integer' } }, required: ['title', 'notes', 'n'], additionalProperties: false };

const dir = makeTempDir();
const models = path.join(dir, 'models');
fs.mkdirSync(models);
const id = path.basename(model, '.gguf');
fs.symlinkSync(path.resolve(model), path.join(models, `${id}.gguf`));
const node = await startNode(dir, models, { parallel: 8, expectModels: [id], args: ['--threads', THREADS] });
try {
  const placed = await http(`${node.url}/place_instance`, { body: { model_id: id } });
  if (placed.status !== 200)
    throw new Error(JSON.stringify(placed.json));
  const one = async (i, schema) => {
    const body = { model: id, prompt: `Item ${i}:`, max_tokens: TOKENS, temperature: 0, ignore_eos: !schema };
    if (schema)
      body.response_format = { type: 'json_schema', json_schema: { name: 's', schema: SCHEMA } };
    const r = await http(`${node.url}/v1/completions`, { body, timeoutMs: 900_000 });
    if (r.status !== 200)
      throw new Error(JSON.stringify(r.json));
    return r.json.usage.completion_tokens;
  };
  const run = async (streams, schema) => {
    const t0 = performance.now();
    const n = (await Promise.all(Array.from({ length: streams }, (_, i) => one(i, schema)))).reduce((a, b) => a + b, 0);
    return { tps: n / ((performance.now() - t0) / 1000), n };
  };
  for (let tries = 0; ; tries++) { // the runner loads the model: wait for its first answer
    try {
      await run(1, false);
      break;
    } catch (e) {
      if (tries > 120)
        throw e;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
  await run(1, true);
  for (const streams of [1, 8]) {
    const got = { plain: [], schema: [] };
    for (let r = 0; r < REPS; r++)
      for (const schema of r % 2 ? [true, false] : [false, true]) { // ABBA: neither always goes first
        const { tps, n } = await run(streams, schema);
        got[schema ? 'schema' : 'plain'].push(tps);
        console.log(`streams ${streams} ${schema ? 'schema' : 'plain '} run ${r}: ${n} tokens, ${tps.toFixed(2)} tok/s`);
      }
    const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
    const p = med(got.plain), s = med(got.schema);
    console.log(`streams ${streams}: median plain ${p.toFixed(2)} tok/s, schema ${s.toFixed(2)} tok/s, ` +
      `schema/plain ${(s / p).toFixed(3)}`);
  }
} finally {
  await node.stop();
  removeTempDir(dir);
}
