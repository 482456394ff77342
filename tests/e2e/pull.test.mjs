// Models from the hub (issue 17) against a fake hub (fakehub.mjs) on 127.0.0.1, never the
// real one: `cairn pull` by each reference form; a second pull finds the model here and
// fetches nothing; a pull killed with SIGKILL part-way resumes, and the hub sends less
// than 1.25x the file in all; a file whose bytes are not the listed SHA-256 is refused and
// no model appears; a gated repo wants HF_TOKEN (and says so), which is sent to the hub
// and not to the storage host; 429 with Retry-After is waited out; unknown repos, tags and
// files are refused naming them; HF_HUB_OFFLINE finds what is here and nothing else;
// a disk without room refuses the pull before fetching (a 32 MiB tmpfs, when one can be
// mounted); `cairn ls` and `cairn rm`; a node serves a pulled model under the reference as
// typed (owner/repo:q8_0) through the OpenAI client; and `cairn run` of a reference no node
// has pulls it onto its node (with the pull's progress), places it and answers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { Ollama } from 'ollama';
import { BINARY, SHARED, SLOW, makeTempDir, removeTempDir, startNode, sleep, http, waitState, clusterPort,
  instanceReady } from './cairn.mjs';
import { startFakeHub } from './fakehub.mjs';

const T = { timeout: 300_000 * SLOW };
const VOCAB = path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-spm.gguf');
let dir, hub, q8, f16, whole, parts, big;

function cairn(args, env = {}, timeoutMs = 120_000 * SLOW) {
  return new Promise((resolve) => {
    const child = execFile(BINARY, args, { timeout: timeoutMs, maxBuffer: 16 << 20,
      env: { ...process.env, HF_ENDPOINT: hub.url, HF_TOKEN: '', HF_HUB_OFFLINE: '', ...env } },
    (err, stdout, stderr) => resolve({ code: err ? (typeof err.code === 'number' ? err.code : -1) : 0, stdout, stderr }));
    child.stdin.end();
  });
}

function mk(args) {
  return new Promise((resolve, reject) => execFile(BINARY, ['mkmodel', ...args], (e) => (e ? reject(e) : resolve())));
}

const models = (name) => path.join(dir, name);

/** Prints the end of a node's log without its access lines (when a test fails). */
function logTail(node, lines) {
  console.log(node.log().split('\n').filter((l) => !l.includes(' http ')).slice(-lines).join('\n'));
}

before(async () => {
  dir = makeTempDir();
  await mk(['--shape', 'tiny', '--vocab', VOCAB, '--type', 'q8_0', '-o', path.join(dir, 'q8.gguf')]);
  await mk(['--shape', 'tiny', '--vocab', VOCAB, '--type', 'f16', '-o', path.join(dir, 'f16.gguf')]);
  q8 = fs.readFileSync(path.join(dir, 'q8.gguf'));
  f16 = fs.readFileSync(path.join(dir, 'f16.gguf'));
  // one model, whole and in 3 parts (gguf-split's layout)
  await mk(['--shape', 'tiny', '--vocab', VOCAB, '--seed', '9', '-o', path.join(dir, 'whole.gguf')]);
  await mk(['--shape', 'tiny', '--vocab', VOCAB, '--seed', '9', '--split', '3', '-o', path.join(dir, 'sp.gguf')]);
  whole = fs.readFileSync(path.join(dir, 'whole.gguf'));
  parts = [1, 2, 3].map((k) => fs.readFileSync(path.join(dir, `sp-0000${k}-of-00003.gguf`)));
  big = crypto.randomBytes(80 << 20); // over 64 MiB: fetched over several connections
  hub = await startFakeHub({
    pageSize: 2, // the listing comes in pages
    repos: {
      'test-org/Tiny-GGUF': { downloads: 500, files: [{ path: 'README.md', bytes: Buffer.from('# tiny\n') },
        { path: 'Tiny-Q8_0.gguf', bytes: q8 }, { path: 'Tiny-Q4_K_M.gguf', bytes: f16 },
        { path: 'mmproj-Tiny-f16.gguf', bytes: Buffer.from('not a model') }] },
      'test-org/Broken-GGUF': { files: [{ path: 'Broken-Q8_0.gguf', bytes: q8 }], corrupt: 'Broken-Q8_0.gguf' },
      'test-org/Gated-GGUF': { files: [{ path: 'Gated-Q8_0.gguf', bytes: q8 }], gated: 'hf_good_token' },
      'test-org/Whole-GGUF': { downloads: 900, files: [{ path: 'Whole-Q8_0.gguf', bytes: whole }] },
      'test-org/Huge-GGUF': { files: [1, 2].map((k) => ({ path: `Huge-Q8_0-0000${k}-of-00002.gguf`, bytes: q8,
        listedSize: 2 ** 52 })) },
      'test-org/Docs-Only': { downloads: 5000, files: [{ path: 'README.md', bytes: Buffer.from('no model') }] },
      'test-org/Split-GGUF': { files: parts.map((bytes, k) => ({ path: `Q8_0/Split-Q8_0-0000${k + 1}-of-00003.gguf`,
        bytes })) },
      'test-org/Big-GGUF': { files: [{ path: 'Big-Q8_0.gguf', bytes: big }] },
    },
  });
  process.env.HF_ENDPOINT = hub.url; // nodes started here pull from the fake hub
  process.env.HF_TOKEN = '';
});

after(async () => {
  await hub?.close();
  removeTempDir(dir);
});

test('pull by each reference form, then again: nothing fetched', T, async () => {
  const d = models('forms');
  const forms = [['test-org/Tiny-GGUF:q8_0', 'hf.co/test-org/Tiny-GGUF:Q8_0', q8],
    ['hf.co/test-org/Tiny-GGUF', 'hf.co/test-org/Tiny-GGUF:Q4_K_M', f16],
    ['https://huggingface.co/test-org/Tiny-GGUF/Tiny-Q8_0.gguf', 'hf.co/test-org/Tiny-GGUF/Tiny-Q8_0.gguf', q8]];
  for (const [ref, id, bytes] of forms) {
    const r = await cairn(['pull', ref, '--models-dir', d]);
    assert.equal(r.code, 0, `${ref}: ${r.stderr}`);
    assert.equal(r.stdout.trim(), id, 'the canonical reference is printed');
    const local = path.join(d, `${id.replaceAll('/', '~').replace(/\.gguf$/, '')}.gguf`);
    assert.ok(fs.readFileSync(local).equals(bytes), `${local} holds the repo's file`);
    assert.ok(!fs.readdirSync(d).some((f) => f.endsWith('.partial')), 'no partial file left');
  }
  const before = hub.storageBytes;
  const again = await cairn(['pull', 'test-org/Tiny-GGUF:Q8_0', '--models-dir', d]);
  assert.equal(again.code, 0, again.stderr);
  assert.match(again.stderr, /already here/);
  assert.equal(hub.storageBytes, before, 'nothing fetched the second time');
  const ls = await cairn(['ls', '--models-dir', d]);
  assert.equal(ls.code, 0, ls.stderr);
  for (const [, id] of forms)
    assert.ok(ls.stdout.includes(id), `ls lists ${id}: ${ls.stdout}`);
  const off = await cairn(['pull', 'test-org/Tiny-GGUF:Q8_0', '--models-dir', d], { HF_HUB_OFFLINE: '1' });
  assert.equal(off.code, 0, off.stderr);
  const offMissing = await cairn(['pull', 'test-org/Gated-GGUF:Q8_0', '--models-dir', d], { HF_HUB_OFFLINE: '1' });
  assert.equal(offMissing.code, 1);
  assert.match(offMissing.stderr, /HF_HUB_OFFLINE/);
  const rm = await cairn(['rm', 'test-org/Tiny-GGUF', '--models-dir', d]);
  assert.equal(rm.code, 0, rm.stderr);
  const ls2 = await cairn(['ls', '--models-dir', d]);
  assert.ok(!ls2.stdout.includes('Q4_K_M'), `rm took the default tag's model away: ${ls2.stdout}`);
  assert.ok(ls2.stdout.includes('hf.co/test-org/Tiny-GGUF:Q8_0'), 'and left the others');
});

test('a pull killed part-way resumes; the hub sends less than 1.25x the file', T, async () => {
  const d = models('resume');
  hub.throttle = 4 << 20;
  const sent0 = hub.storageBytes;
  const child = spawn(BINARY, ['pull', 'test-org/Tiny-GGUF:Q4_K_M', '--models-dir', d],
    { env: { ...process.env, HF_ENDPOINT: hub.url, HF_TOKEN: '' }, stdio: 'ignore' });
  const partial = path.join(d, '.hf.co~test-org~Tiny-GGUF:Q4_K_M.gguf.partial');
  const until = Date.now() + 60_000 * SLOW;
  while (Date.now() < until) {
    const size = fs.existsSync(partial) ? fs.statSync(partial).size : 0;
    if (size > f16.length / 3)
      break;
    await sleep(20);
  }
  child.kill('SIGKILL');
  await new Promise((resolve) => child.on('exit', resolve));
  const have = fs.statSync(partial).size;
  assert.ok(have > 0 && have < f16.length, `killed part-way (${have} of ${f16.length} bytes)`);
  hub.throttle = 0;
  const r = await cairn(['pull', 'test-org/Tiny-GGUF:Q4_K_M', '--models-dir', d]);
  assert.equal(r.code, 0, r.stderr);
  const sent = hub.storageBytes - sent0;
  console.log(`figure: resumed pull of ${f16.length} bytes: the hub sent ${sent} (${(sent / f16.length).toFixed(3)}x)`);
  assert.ok(sent < 1.25 * f16.length, `the hub sent ${sent} bytes for a file of ${f16.length}`);
  assert.ok(fs.readFileSync(path.join(d, 'hf.co~test-org~Tiny-GGUF:Q4_K_M.gguf')).equals(f16), 'the file is whole');
});

test('a large file comes in ranges over several connections; killed part-way, a pull fetches only its holes', T,
  async () => {
    const d = models('parallel');
    hub.throttle = 8 << 20; // per connection, as a CDN limits each
    const sent0 = hub.storageBytes;
    const child = spawn(BINARY, ['pull', 'test-org/Big-GGUF:Q8_0', '--models-dir', d],
      { env: { ...process.env, HF_ENDPOINT: hub.url, HF_TOKEN: '' }, stdio: 'ignore' });
    const record = path.join(d, '.hf.co~test-org~Big-GGUF:Q8_0.gguf.partial.have');
    const until = Date.now() + 60_000 * SLOW;
    let ranges = [];
    const recorded = () => ranges.reduce((n, [a, b]) => n + b - a, 0);
    while (Date.now() < until && recorded() < big.length / 3) {
      try { ranges = JSON.parse(fs.readFileSync(record, 'utf8')).ranges; } catch { /* not yet */ }
      await sleep(20);
    }
    child.kill('SIGKILL');
    await new Promise((resolve) => child.on('exit', resolve));
    // four connections at once, each on its own 16 MiB range: apart in the record
    assert.ok(ranges.length >= 2, `ranges apart in the record before the kill: ${JSON.stringify(ranges)}`);
    hub.throttle = 0;
    const r = await cairn(['pull', 'test-org/Big-GGUF:Q8_0', '--models-dir', d]);
    assert.equal(r.code, 0, r.stderr);
    const sent = hub.storageBytes - sent0;
    console.log(`figure: a ${big.length}-byte pull over 4 connections, killed and resumed: the hub sent ${sent} ` +
      `(${(sent / big.length).toFixed(3)}x)`);
    // what was in flight at the kill is lost: bytes not yet recorded (2 MiB a connection) and in the sockets
    assert.ok(sent < 1.25 * big.length, `the hub sent ${sent} bytes for a file of ${big.length}`);
    assert.ok(fs.readFileSync(path.join(d, 'hf.co~test-org~Big-GGUF:Q8_0.gguf')).equals(big), 'the file is whole');
    assert.ok(!fs.existsSync(record), 'the record of ranges is gone once the file is whole');
    fs.rmSync(d, { recursive: true, force: true });
  });

test('a wrong hash, a gated repo, a busy hub, unknown names', T, async () => {
  const d = models('errors');
  const bad = await cairn(['pull', 'test-org/Broken-GGUF:Q8_0', '--models-dir', d]);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /SHA-256 .* not the hub's/);
  assert.ok(!fs.readdirSync(d).some((f) => f.includes('Broken')), `no file of it is left: ${fs.readdirSync(d)}`);

  const gated = await cairn(['pull', 'test-org/Gated-GGUF:Q8_0', '--models-dir', d]);
  assert.equal(gated.code, 1);
  assert.match(gated.stderr, /gated or private .*set HF_TOKEN/);
  const wrong = await cairn(['pull', 'test-org/Gated-GGUF:Q8_0', '--models-dir', d], { HF_TOKEN: 'hf_wrong' });
  assert.equal(wrong.code, 1);
  assert.match(wrong.stderr, /refused HF_TOKEN/);
  hub.authSeen.length = 0;
  hub.storageAuth.length = 0;
  hub.busy = 2;
  const ok = await cairn(['pull', 'test-org/Gated-GGUF:Q8_0', '--models-dir', d], { HF_TOKEN: 'hf_good_token' });
  assert.equal(ok.code, 0, ok.stderr);
  assert.equal(hub.status429, 2, 'two 429s were answered, then waited out');
  assert.ok(hub.authSeen.length && hub.authSeen.every((a) => a === 'Bearer hf_good_token'),
    'the hub saw the token on its routes');
  assert.ok(hub.storageAuth.length && hub.storageAuth.every((a) => a === ''),
    `the storage host never saw it: ${JSON.stringify(hub.storageAuth)}`);

  const huge = await cairn(['pull', 'test-org/Huge-GGUF:Q8_0', '--models-dir', d]);
  assert.equal(huge.code, 1);
  assert.match(huge.stderr, /more than a model may have/, 'sizes a listing claims cannot wrap the disk check');
  const cases = [['test-org/Nope-GGUF:Q8_0', /RepoNotFound/], ['test-org/Tiny-GGUF:Q5_K_M', /no Q5_K_M .*Q8_0, Q4_K_M/],
    ['test-org/Tiny-GGUF/nope.gguf', /no file nope.gguf/], ['not a ref', /not a model reference/]];
  for (const [ref, why] of cases) {
    const r = await cairn(['pull', ref, '--models-dir', d]);
    assert.equal(r.code, ref === 'not a ref' ? 1 : 1, `${ref}: ${r.stderr}`);
    assert.match(r.stderr, why);
  }
});

test('a node serves a pulled model under the reference as typed', T, async () => {
  const d = models('serve');
  const r = await cairn(['pull', 'test-org/Tiny-GGUF:Q8_0', '--models-dir', d]);
  assert.equal(r.code, 0, r.stderr);
  const node = await startNode(dir, d, { name: 'serve', expectModels: ['hf.co/test-org/Tiny-GGUF:Q8_0'] });
  try {
    const openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const list = await openai.models.list();
    assert.ok(list.data.some((m) => m.id === 'hf.co/test-org/Tiny-GGUF:Q8_0'), 'listed under its reference');
    const c = await openai.completions.create({ model: 'test-org/Tiny-GGUF:q8_0', prompt: 'Hello', max_tokens: 4,
      temperature: 0, ignore_eos: true });
    assert.equal(c.usage.completion_tokens, 4, 'answered by the reference as typed');
  } catch (e) {
    logTail(node, 30);
    throw e;
  } finally {
    await node.stop();
  }
});

test("Ollama's client pulls, lists and deletes through a node", T, async () => {
  const d = models('ollama');
  fs.mkdirSync(d, { recursive: true });
  const node = await startNode(dir, d, { name: 'ollama' });
  try {
    const ollama = new Ollama({ host: node.url });
    const seen = [];
    for await (const part of await ollama.pull({ model: 'test-org/Tiny-GGUF:Q8_0', stream: true }))
      seen.push(part);
    assert.equal(seen[0].status, 'pulling manifest');
    const bytes = seen.filter((p) => p.digest);
    assert.ok(bytes.length >= 1 && bytes.every((p) => p.digest.startsWith('sha256:') && p.total === q8.length),
      `progress lines with the digest and total: ${JSON.stringify(bytes.slice(-2))}`);
    assert.equal(bytes.at(-1).completed, q8.length);
    assert.deepEqual(seen.slice(-2).map((p) => p.status), ['writing manifest', 'success']);
    const list = await ollama.list();
    assert.ok(list.models.some((m) => m.name === 'hf.co/test-org/Tiny-GGUF:Q8_0'), JSON.stringify(list.models));
    // the pull is one of the node's downloads in the cluster's state
    await waitState(node, (s) => (s.downloads ?? []).some((d) => d.model_id === 'hf.co/test-org/Tiny-GGUF:Q8_0' &&
      d.status === 'Completed' && d.bytes_done === q8.length), 'the pull in /state as a Completed download');
    const show = await ollama.show({ model: 'test-org/Tiny-GGUF:q8_0' });
    assert.ok(show.modelfile.includes('FROM'), 'show finds the model as typed');
    const once = await ollama.pull({ model: 'hf.co/test-org/Tiny-GGUF:Q4_K_M', stream: false });
    assert.equal(once.status, 'success');
    await assert.rejects(ollama.pull({ model: 'llama3.2', stream: false }), /hf\.co\/OWNER\/REPO:TAG/);
    await assert.rejects(ollama.generate({ model: 'test-org/Gated-GGUF:Q8_0', prompt: 'hi' }), /pull it first/,
      'a request for a model no node has says to pull it');
    await assert.rejects(ollama.pull({ model: 'test-org/Nope-GGUF:Q8_0', stream: false }), /RepoNotFound/);
    await ollama.delete({ model: 'hf.co/test-org/Tiny-GGUF:Q8_0' });
    const after = await ollama.list();
    assert.ok(!after.models.some((m) => m.name === 'hf.co/test-org/Tiny-GGUF:Q8_0'), 'deleted');
    assert.ok(after.models.some((m) => m.name === 'hf.co/test-org/Tiny-GGUF:Q4_K_M'), 'the other stays');
    await assert.rejects(ollama.delete({ model: 'nope' }), /not found|no model/);
  } catch (e) {
    logTail(node, 30);
    throw e;
  } finally {
    await node.stop();
  }
});

test('cairn run pulls a hub model onto the node, places it and answers', T, async () => {
  const d = models('run');
  fs.mkdirSync(d, { recursive: true });
  const node = await startNode(dir, d, { name: 'run' });
  try {
    const r = await cairn(['run', '--host', `127.0.0.1:${node.port}`, 'test-org/Whole-GGUF:q8_0', '--set', 'max_tokens=4',
      '--set', 'temperature=0', 'Hello']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /pulling test-org\/Whole-GGUF:q8_0 onto the node/);
    assert.match(r.stderr, /verifying test-org\/Whole-GGUF:q8_0 part 1\/1: 100\.0% \(16\.1 MiB of 16\.1 MiB/,
      'the progress lines of the pull');
    assert.match(r.stderr, /pulled hf\.co\/test-org\/Whole-GGUF:Q8_0/);
    assert.match(r.stderr, /runs on 1 node:\n {2}rank 0 .* layers 0-5 \(6\)/, 'where it runs');
    assert.ok(r.stdout.trim().length > 0, 'an answer');
    const s = (await http(`${node.url}/state`, { method: 'GET' })).json;
    assert.ok(s.downloads.some((x) => x.model_id === 'hf.co/test-org/Whole-GGUF:Q8_0' && x.status === 'Completed'),
      'the pull is one of the node\'s downloads');
    const again = await cairn(['run', '--host', `127.0.0.1:${node.port}`, 'test-org/Whole-GGUF:q8_0', '--set',
      'max_tokens=2', 'Hi']);
    assert.equal(again.code, 0, again.stderr);
    assert.doesNotMatch(again.stderr, /pulling/, 'a model the cluster has is not pulled again');
  } catch (e) {
    logTail(node, 30);
    throw e;
  } finally {
    await node.stop();
  }
});

test('a pulled model placed on a node that lacks it comes from its peer, under the same name', T, async () => {
  const da = models('peer-a'), db = models('peer-b');
  fs.mkdirSync(db, { recursive: true });
  const r = await cairn(['pull', 'test-org/Tiny-GGUF:Q8_0', '--models-dir', da]);
  assert.equal(r.code, 0, r.stderr);
  const id = 'hf.co/test-org/Tiny-GGUF:Q8_0';
  const a = await startNode(dir, da, { name: 'peer-a', expectModels: [id] });
  const b = await startNode(dir, db, { name: 'peer-b', args: ['--peer', `127.0.0.1:${clusterPort(a)}`] });
  try {
    await waitState(a, (s) => Object.keys(s.nodes).length === 2, 'two nodes');
    const card = (await http(`${a.url}/models`, { method: 'GET' })).json.models.find((m) => m.id === id);
    assert.ok(card, 'node a lists the pulled model');
    const bId = (await http(`${b.url}/node_id`, { method: 'GET' })).json.node_id;
    const hubBytes = hub.storageBytes;
    const body = { instance: { instance_id: 'on-b', model_id: id,
      shards: [{ node_id: bId, layer_begin: 0, layer_end: card.n_layers }] } };
    const placed = await http(`${a.url}/instance`, { body });
    assert.equal(placed.status, 200, placed.text);
    await waitState(a, (s) => instanceReady(s, 'on-b'), 'the instance on b is ready');
    const openai = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const c = await openai.completions.create({ model: 'test-org/Tiny-GGUF:q8_0', prompt: 'Hello', max_tokens: 4,
      temperature: 0, ignore_eos: true });
    assert.equal(c.usage.completion_tokens, 4);
    assert.ok(fs.readFileSync(path.join(db, 'hf.co~test-org~Tiny-GGUF:Q8_0.gguf')).equals(q8), 'b holds the file');
    assert.equal(JSON.parse(fs.readFileSync(path.join(db, 'hf.co~test-org~Tiny-GGUF:Q8_0.pull.json'))).ref, id);
    assert.equal(hub.storageBytes, hubBytes, 'from the peer, not the hub');
    const listed = (await http(`${b.url}/v1/models`, { method: 'GET' })).json.data.map((m) => m.id);
    assert.ok(listed.includes(id), `b lists it under its reference: ${listed}`);
  } catch (e) {
    for (const n of [a, b])
      logTail(n, 20);
    throw e;
  } finally {
    await b.stop();
    await a.stop();
  }
});

test('a model in 3 parts pulls as one and answers as the whole file does, token for token', T, async () => {
  const d = models('split');
  for (const ref of ['test-org/Whole-GGUF:Q8_0', 'test-org/Split-GGUF:Q8_0']) {
    const r = await cairn(['pull', ref, '--models-dir', d]);
    assert.equal(r.code, 0, `${ref}: ${r.stderr}`);
  }
  const local = fs.readdirSync(d).filter((f) => f.includes('Split')).sort();
  assert.deepEqual(local, ['hf.co~test-org~Split-GGUF:Q8_0-00001-of-00003.gguf',
    'hf.co~test-org~Split-GGUF:Q8_0-00002-of-00003.gguf', 'hf.co~test-org~Split-GGUF:Q8_0-00003-of-00003.gguf',
    'hf.co~test-org~Split-GGUF:Q8_0.pull.json'], 'three parts and a sidecar');
  const ls = await cairn(['ls', '--models-dir', d]);
  assert.equal(ls.stdout.split('\n').filter((l) => l.includes('Split-GGUF')).length, 1, `listed once: ${ls.stdout}`);
  const node = await startNode(dir, d, { name: 'split',
    expectModels: ['hf.co/test-org/Whole-GGUF:Q8_0', 'hf.co/test-org/Split-GGUF:Q8_0'] });
  try {
    const openai = new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const ids = (await openai.models.list()).data.map((m) => m.id);
    assert.equal(ids.filter((id) => id.includes('Split')).length, 1, `one model, not three: ${ids}`);
    const texts = new Set();
    for (const prompt of ['Hello', 'The sky is', 'Numbers: 1 2 3']) {
      const ask = (model) => openai.completions.create({ model, prompt, max_tokens: 6, temperature: 0,
        ignore_eos: true, logprobs: 1 });
      const a = await ask('test-org/Whole-GGUF:Q8_0'), b = await ask('test-org/Split-GGUF:Q8_0');
      assert.equal(b.choices[0].text, a.choices[0].text, `the same tokens for '${prompt}'`);
      assert.deepEqual(b.choices[0].logprobs.token_logprobs, a.choices[0].logprobs.token_logprobs,
        `the same log-probabilities for '${prompt}'`);
      texts.add(a.choices[0].text);
    }
    assert.ok(texts.size > 1, 'different prompts, different answers');
  } catch (e) {
    logTail(node, 30);
    throw e;
  } finally {
    await node.stop();
  }
});

test('the 3-part model split over two nodes by layers answers as the whole file does', T, async () => {
  const d = models('split'); // pulled by the test before; both nodes read this folder
  const id = 'hf.co/test-org/Split-GGUF:Q8_0';
  const a = await startNode(dir, d, { name: 'split-a', expectModels: [id] });
  const b = await startNode(dir, d, { name: 'split-b', args: ['--peer', `127.0.0.1:${clusterPort(a)}`] });
  try {
    await waitState(a, (s) => Object.keys(s.nodes).length === 2, 'two nodes');
    const openai = new OpenAI({ baseURL: `${a.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const ask = (model) => openai.completions.create({ model, prompt: 'The sky is', max_tokens: 6, temperature: 0,
      ignore_eos: true, logprobs: 1 });
    const want = await ask('test-org/Whole-GGUF:Q8_0');
    const placed = await http(`${a.url}/place_instance`, { body: { model_id: id, sharding: 'pipeline', min_nodes: 2 } });
    assert.equal(placed.status, 200, placed.text);
    const s = await waitState(a, (st) => instanceReady(st, placed.json.instance_id), 'the pipeline is ready');
    assert.equal(s.instances[placed.json.instance_id].shards.length, 2, 'two ranks');
    const got = await ask(id);
    assert.equal(got.choices[0].text, want.choices[0].text);
    assert.deepEqual(got.choices[0].logprobs.token_logprobs, want.choices[0].logprobs.token_logprobs);
  } catch (e) {
    for (const n of [a, b])
      logTail(n, 20);
    throw e;
  } finally {
    await b.stop();
    await a.stop();
  }
});

test('a disk without room for the model: refused before a byte is fetched, saying how much', T, async (t) => {
  const d = models('small-disk');
  fs.mkdirSync(d, { recursive: true });
  const mount = await new Promise((resolve) => execFile('mount', ['-t', 'tmpfs', '-o', 'size=32m', 'tmpfs', d],
    (err) => resolve(err)));
  if (mount) {
    t.skip(`cannot mount a small tmpfs here: ${mount.message}`);
    return;
  }
  try {
    const before = hub.storageBytes;
    const r = await cairn(['pull', 'test-org/Tiny-GGUF:Q8_0', '--models-dir', d]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, /not enough disk space in .* \d+ bytes needed and \d+ kept free, \d+ free/);
    assert.equal(hub.storageBytes, before, 'nothing was fetched');
    assert.deepEqual(fs.readdirSync(d), [], 'nothing was left');
  } finally {
    await new Promise((resolve) => execFile('umount', [d], resolve));
  }
});

test('search the hub: GGUF repos, most downloaded first, from the CLI and a node', T, async () => {
  const r = await cairn(['search', 'test-org', '--limit', '3']);
  assert.equal(r.code, 0, r.stderr);
  const refs = r.stdout.split('\n').slice(1).filter(Boolean).map((l) => l.split(/\s+/)[0]);
  assert.deepEqual(refs, ['hf.co/test-org/Whole-GGUF', 'hf.co/test-org/Tiny-GGUF', 'hf.co/test-org/Broken-GGUF'],
    `most downloaded first, GGUF repos only, the malformed entry skipped: ${r.stdout}`);
  const node = await startNode(dir, models('search'), { name: 'search' });
  try {
    const s = await http(`${node.url}/hub/search?q=gated`, { method: 'GET' });
    assert.equal(s.status, 200, s.text);
    assert.deepEqual(s.json.models.map((m) => [m.ref, m.gated]), [['hf.co/test-org/Gated-GGUF', true]]);
    assert.equal((await http(`${node.url}/hub/search`, { method: 'GET' })).status, 400, 'q is required');
    assert.equal((await http(`${node.url}/hub/search?q=x&limit=0`, { method: 'GET' })).status, 400);
  } finally {
    await node.stop();
  }
});
