// A hub model that no node has, placed across two nodes (issue 17, part 3), against a
// fake hub (fakehub.mjs) on 127.0.0.1, never the real one: the previews of the reference
// as typed come from its header alone; the placement makes each rank fetch its own
// layers' byte ranges (a sparse file), not the whole file, and its answers equal those
// of the same file placed whole on one node. Bytes per rank are printed for the record.
// Downloads on a given node through another node's API: start (a whole pull), cancel,
// delete; a node killed with SIGKILL mid-pull and started again resumes the pull. This model ties its head to the embeddings (as Llama 3.2 does), so both ranks read
// the embeddings: a rank reads half the layers and the embeddings.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import { BINARY, SHARED, SLOW, makeTempDir, removeTempDir, startNode, http, waitState, clusterPort,
  instanceReady, deleteInstance } from './cairn.mjs';
import { execFile } from 'node:child_process';
import { startFakeHub } from './fakehub.mjs';

const T = { timeout: 600_000 * SLOW };
const VOCAB = path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-spm.gguf');
// Layers large beside the embeddings, as in the models people run (the tiny shape is
// all embeddings): 8 layers of 512.
const SHAPE = ['--arch', 'llama', '--n-embd', '512', '--n-layers', '8', '--n-head', '8', '--n-head-kv', '4',
  '--n-ff', '2048', '--seed', '11'];
const REF = 'test-org/Pipe-GGUF:q8_0';
const ID = 'hf.co/test-org/Pipe-GGUF:Q8_0';
let dir, hub, file, large, parts, nodes = [];
const PROMPTS = ['Once upon a time', 'The capital of France is', '1, 2, 3,'];
let wholeAnswers = []; // the whole file's, placed on one node

const mk = (args) => new Promise((resolve, reject) =>
  execFile(BINARY, ['mkmodel', ...args], (e) => (e ? reject(e) : resolve())));

before(async () => {
  dir = makeTempDir();
  await mk([...SHAPE, '--vocab', VOCAB, '--type', 'q8_0', '-o', path.join(dir, 'pipe.gguf')]);
  file = fs.readFileSync(path.join(dir, 'pipe.gguf'));
  await mk([...SHAPE, '--vocab', VOCAB, '--type', 'q8_0', '--split', '3', '-o', path.join(dir, 'sp.gguf')]);
  parts = [1, 2, 3].map((k) => fs.readFileSync(path.join(dir, `sp-0000${k}-of-00003.gguf`)));
  large = Buffer.concat([file, crypto.randomBytes((80 << 20) - file.length)]); // over 64 MiB: 4 connections
  hub = await startFakeHub({ repos: { 'test-org/Pipe-GGUF': { files: [{ path: 'Pipe-Q8_0.gguf', bytes: file }] },
    'test-org/Other-GGUF': { files: [{ path: 'Other-Q8_0.gguf', bytes: file }] },
    'test-org/Large-GGUF': { files: [{ path: 'Large-Q8_0.gguf', bytes: large }] },
    'test-org/Split-GGUF': { files: parts.map((bytes, k) => ({ path: `Split-Q8_0-0000${k + 1}-of-00003.gguf`, bytes })) },
  } });
  process.env.HF_ENDPOINT = hub.url;
  process.env.HF_TOKEN = '';
  for (const name of ['a', 'b']) {
    const models = path.join(dir, `models-${name}`);
    fs.mkdirSync(models);
    const args = ['-t', '1'];
    if (nodes.length)
      args.push('--peer', `127.0.0.1:${clusterPort(nodes[0])}`);
    nodes.push(await startNode(dir, models, { name, args }));
  }
  await waitState(nodes[0], (s) => Object.keys(s.nodes).length === 2, 'two nodes in the cluster');
});

after(async () => {
  for (const n of nodes)
    await n?.stop();
  await hub?.close();
  removeTempDir(dir);
});

const complete = (node, model, prompt) => new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'none' }).completions
  .create({ model, prompt, max_tokens: 12, temperature: 0 }).then((r) => r.choices[0].text);

test('a hub model no node has: previews from its header, then each rank fetches only its layers', T, async () => {
  const [a, b] = nodes;
  const fileBytes = file.length;
  const cat = await http(`${b.url}/catalog?q=${encodeURIComponent('llama 3.2')}`, { method: 'GET' });
  assert.equal(cat.status, 200, cat.text);
  assert.deepEqual(cat.json.models.map((m) => m.repo).sort(), ['bartowski/Llama-3.2-1B-Instruct-GGUF',
    'bartowski/Llama-3.2-3B-Instruct-GGUF'], 'the catalog\'s Llama 3.2 cards');
  assert.ok(cat.json.models[0].quants.every((q) => q.ref.startsWith('hf.co/bartowski/') && q.approx_bytes > 0));
  // previews, before any layer is anywhere
  const pv = await http(`${b.url}/instance/previews?model_id=${encodeURIComponent(REF)}&sharding=pipeline&min_nodes=2`,
    { method: 'GET' });
  assert.equal(pv.status, 200, pv.text);
  const fromHeader = hub.storageBytes;
  assert.ok(fromHeader > 0 && fromHeader < fileBytes / 4, `the previews read the header only: ${fromHeader} of ${fileBytes}`);

  const r = await http(`${b.url}/place_instance`, { body: { model_id: REF, sharding: 'pipeline', min_nodes: 2 } });
  assert.equal(r.status, 200, r.text);
  const id = r.json.instance_id;
  const s = await waitState(a, (st) => instanceReady(st, id), `instance ${id} ready`, 300_000 * SLOW);
  const inst = s.instances[id];
  assert.equal(inst.model_id, ID, 'the instance names the model by its canonical reference');
  assert.equal(inst.shards.length, 2);

  // each node's download of the model is its rank's layers, and less than the file
  const perRank = inst.shards.map((sh) => {
    const d = s.downloads.find((x) => x.node_id === sh.node_id && x.model_id === ID);
    assert.ok(d, `node ${sh.node_id} has a download of ${ID}: ${JSON.stringify(s.downloads)}`);
    assert.equal(d.status, 'Completed');
    assert.deepEqual(d.layers, [sh.layer_begin, sh.layer_end], 'the download is of the rank\'s layers');
    return d.bytes_total;
  });
  for (const bytes of perRank)
    assert.ok(bytes < 0.8 * fileBytes, `a rank reads ${bytes} of ${fileBytes} bytes`);
  const served = hub.storageBytes;
  console.log(`# file ${fileBytes} bytes; rank bytes ${perRank.join(', ')} (${perRank.map((x) =>
    (x / fileBytes).toFixed(3)).join(', ')} of the file); hub storage sent ${served} in all ` +
    `(${(served / fileBytes).toFixed(3)} x the file)`);
  // Nothing was fetched twice by a node: the ranks' bytes and a first read of the
  // header on each node (at most 1 MiB each; its tail is the start of the data).
  assert.ok(served <= perRank[0] + perRank[1] + 2 * 1048576,
    `the hub sent ${served} bytes for ranks of ${perRank.join(' + ')} bytes`);
  for (const name of ['models-a', 'models-b'])
    assert.ok(!fs.readdirSync(path.join(dir, name)).some((f) => f.endsWith('.gguf')),
      `no whole model in ${name}: ${fs.readdirSync(path.join(dir, name))}`);

  // the ranks' answers are the whole file's
  const prompts = PROMPTS;
  const got = [];
  for (const p of prompts)
    got.push(await complete(a, ID, p));
  await deleteInstance(a, id);

  // A later placement that puts every layer on one node fetches only what that node
  // lacks; the model is then whole there, verified, and moved into its models folder.
  const rank = inst.shards.find((sh) => sh.rank === 1);
  const had = perRank[1];
  const before = hub.storageBytes;
  const shards = [{ node_id: rank.node_id, layer_begin: 0, layer_end: 8 }];
  const cr = await http(`${a.url}/instance`, { body: { instance: { instance_id: 'whole', model_id: ID, shards } } });
  assert.equal(cr.status, 200, cr.text);
  const s2 = await waitState(a, (st) => instanceReady(st, 'whole'), 'instance whole ready', 300_000 * SLOW);
  const rest = hub.storageBytes - before;
  console.log(`# the rest of the model for one node: ${rest} bytes (it held ${had} of ${fileBytes})`);
  assert.ok(rest <= fileBytes - had + 4096 && rest > 0, `fetched ${rest} bytes where ${fileBytes - had} were missing`);
  const dWhole = s2.downloads.find((x) => x.node_id === rank.node_id && x.model_id === ID);
  assert.equal(dWhole.status, 'Completed');
  assert.equal(dWhole.layers, undefined, 'the node holds the whole model now');
  const folder = rank.node_id === s2.master.node_id ? 'models-a' : 'models-b';
  const holder = nodes[folder === 'models-a' ? 0 : 1];
  assert.ok(fs.readdirSync(path.join(dir, folder)).includes('hf.co~test-org~Pipe-GGUF:Q8_0.gguf'),
    `the whole model moved into ${folder}: ${fs.readdirSync(path.join(dir, folder))}`);
  assert.equal(await complete(holder, ID, prompts[0]), got[0], 'the node alone answers as the ranks did');
  await deleteInstance(a, 'whole');
  fs.copyFileSync(path.join(dir, 'pipe.gguf'), path.join(dir, 'models-a', 'local-pipe.gguf'));
  const one = await http(`${a.url}/place_instance`, { body: { model_id: 'local-pipe', min_nodes: 1 } });
  assert.equal(one.status, 200, one.text);
  await waitState(a, (st) => instanceReady(st, one.json.instance_id), 'the whole file placed');
  for (let i = 0; i < prompts.length; i++)
    assert.equal(await complete(a, 'local-pipe', prompts[i]), got[i], `prompt ${i}: the ranks answer as the whole file`);
  wholeAnswers = got;
  await deleteInstance(a, one.json.instance_id);
  assert.ok(new Set(got).size > 1, 'different prompts, different answers');
});

test('downloads on a given node, asked of another node: start, cancel, delete', T, async () => {
  const [a, b] = nodes;
  const aId = (await http(`${a.url}/node_id`, { method: 'GET' })).json.node_id;
  const OTHER = 'hf.co/test-org/Other-GGUF:Q8_0';
  const nothing = await http(`${b.url}/download/cancel`, { body: { model: OTHER, node_id: aId } });
  assert.equal(nothing.status, 404, nothing.text);
  const bad = await http(`${b.url}/download/start`, { body: { node_id: aId } });
  assert.equal(bad.status, 400, bad.text);

  hub.throttle = 4 << 20; // slow enough to be cancelled part-way
  const start = await http(`${b.url}/download/start`, { body: { model: 'test-org/Other-GGUF:q8_0', node_id: aId } });
  assert.equal(start.status, 202, start.text);
  assert.equal(start.json.node_id, aId, 'the node that started it is a');
  await waitState(b, (s) => s.downloads.some((d) => d.node_id === aId && d.model_id === OTHER && d.status === 'Ongoing' &&
    d.bytes_done > 0), 'the pull on a under way, seen from b');
  const cancel = await http(`${b.url}/download/cancel`, { body: { model: OTHER, node_id: aId } });
  assert.equal(cancel.status, 200, cancel.text);
  await waitState(b, (s) => s.downloads.some((d) => d.node_id === aId && d.model_id === OTHER && d.status === 'Failed'),
    'the cancelled pull ends');
  hub.throttle = 0;
  const again = await http(`${b.url}/download/start`, { body: { model: OTHER, node_id: aId } });
  assert.equal(again.status, 202, again.text);
  const s = await waitState(b, (st) => st.downloads.some((d) => d.node_id === aId && d.model_id === OTHER &&
    d.status === 'Completed'), 'the pull on a completes');
  const d = s.downloads.find((x) => x.node_id === aId && x.model_id === OTHER);
  assert.equal(d.bytes_total, file.length);
  assert.equal(d.layers, undefined, 'a whole copy');
  const onA = () => fs.readdirSync(path.join(dir, 'models-a')).filter((f) => f.startsWith('hf.co~test-org~Other'));
  assert.ok(onA().some((f) => f.endsWith('.gguf')), `the model is in a's folder: ${onA()}`);
  const del = await http(`${b.url}/download/delete`, { body: { model: OTHER, node_id: aId } });
  assert.equal(del.status, 200, del.text);
  assert.deepEqual(onA().filter((f) => !f.startsWith('.')), [], 'deleted from a\'s folder');
  const gone = await http(`${b.url}/download/delete`, { body: { model: OTHER, node_id: aId } });
  assert.equal(gone.status, 404, gone.text);
});

test('a node killed with SIGKILL mid-pull, started again, resumes: the hub sends less than 1.25x the file', T, async () => {
  const b = nodes[1];
  const bId = (await http(`${b.url}/node_id`, { method: 'GET' })).json.node_id;
  const LARGE = 'hf.co/test-org/Large-GGUF:Q8_0';
  hub.throttle = 8 << 20;
  const sent0 = hub.storageBytes;
  const start = await http(`${b.url}/download/start`, { body: { model: LARGE } });
  assert.equal(start.status, 202, start.text);
  await waitState(b, (s) => s.downloads.some((d) => d.node_id === bId && d.model_id === LARGE &&
    d.bytes_done > large.length / 3), 'a third of the pull on b');
  b.proc.kill('SIGKILL');
  await b.exited;
  hub.throttle = 0;
  const models = path.join(dir, 'models-b');
  const again = await startNode(dir, models, { name: 'b', args: ['-t', '1', '--peer', `127.0.0.1:${clusterPort(nodes[0])}`] });
  nodes[1] = again;
  const r = await http(`${again.url}/download/start`, { body: { model: LARGE } });
  assert.equal(r.status, 202, r.text);
  await waitState(again, (s) => s.downloads.some((d) => d.node_id === bId && d.model_id === LARGE &&
    d.status === 'Completed'), 'the pull completes after the restart');
  const sent = hub.storageBytes - sent0;
  console.log(`# a ${large.length}-byte pull, its node killed and started again: the hub sent ${sent} ` +
    `(${(sent / large.length).toFixed(3)}x)`);
  assert.ok(sent < 1.25 * large.length, `the hub sent ${sent} bytes for a file of ${large.length}`);
  assert.ok(fs.readFileSync(path.join(models, 'hf.co~test-org~Large-GGUF:Q8_0.gguf')).equals(large), 'whole and right');
});

test('a model in 3 files that no node has, split over two nodes: each rank fetches its ranges of each file', T,
  async () => {
    assert.equal(wholeAnswers.length, PROMPTS.length, 'the first test gave the whole file\'s answers');
    const a = nodes[0];
    const ID3 = 'hf.co/test-org/Split-GGUF:Q8_0';
    const r = await http(`${a.url}/place_instance`, { body: { model_id: 'test-org/Split-GGUF', sharding: 'pipeline',
      min_nodes: 2 } });
    assert.equal(r.status, 200, r.text);
    const s = await waitState(a, (st) => instanceReady(st, r.json.instance_id), 'the split model placed',
      300_000 * SLOW);
    assert.equal(s.instances[r.json.instance_id].model_id, ID3);
    const ranks = s.downloads.filter((d) => d.model_id === ID3);
    assert.equal(ranks.length, 2, `a download per node: ${JSON.stringify(ranks)}`);
    const total = parts.reduce((n, p) => n + p.length, 0);
    for (const d of ranks)
      assert.ok(d.layers && d.bytes_total < 0.8 * total, `a rank's share: ${JSON.stringify(d)}`);
    for (let i = 0; i < PROMPTS.length; i++)
      assert.equal(await complete(a, ID3, PROMPTS[i]), wholeAnswers[i], `prompt ${i}: as the whole file answers`);
    await deleteInstance(a, r.json.instance_id);
  });
