// A node stopped with SIGTERM says "leave" to its peers and waits for their acks, so the
// master takes it out of the cluster at once instead of after --node-timeout (120 s here,
// longer than the test's bounds); started again from the same data dir, it rejoins under
// the same id and stays. When the master itself leaves, the next master takes it out. An
// instance on a node that leaves is gone from the state at once too.
// Real `cairn node` processes on 127.0.0.1 with --discovery off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { SLOW, makeTempDir, removeTempDir, startNode, http, assertStopsCleanly, getState, waitState,
  clusterPort, sleep, makeModel, placeInstance } from './cairn.mjs';

const T = { timeout: 280_000 * SLOW };
const TIMEOUT = ['--node-timeout', '120'];
const LEAVE_BOUND_MS = 20_000 * SLOW; // generous; the measured time is logged
let dir, models, nodes = [];

before(() => {
  dir = makeTempDir();
  models = path.join(dir, 'models');
  fs.mkdirSync(models, { recursive: true });
});

after(async () => {
  for (const n of nodes)
    await n.stop();
  removeTempDir(dir);
});

async function nodeId(node) {
  const r = await http(`${node.url}/node_id`, { method: 'GET' });
  assert.equal(r.status, 200, r.text);
  return r.json.node_id;
}

async function stop(node) {
  await assertStopsCleanly(node);
  nodes = nodes.filter((n) => n !== node);
}

test('a node stopped with SIGTERM leaves at once, and rejoins when started again', T, async () => {
  const a = await startNode(dir, models, { name: 'a', args: TIMEOUT });
  nodes.push(a);
  const aId = await nodeId(a);
  await waitState(a, (s) => s.master.node_id === aId, 'a is master');
  const peer = [...TIMEOUT, '--peer', `127.0.0.1:${clusterPort(a)}`];
  let b = await startNode(dir, models, { name: 'b', args: peer });
  nodes.push(b);
  const bId = await nodeId(b);
  await waitState(a, (s) => Object.keys(s.nodes).length === 2 && !!s.nodes[bId], 'b in the cluster');

  const t0 = Date.now();
  await stop(b);
  assert.match(b.log(), /leaving the cluster \(1 peers to tell\)/, 'b told its one peer');
  assert.doesNotMatch(b.log(), /did not acknowledge our leave/, 'a acknowledged it');
  await waitState(a, (s) => !s.nodes[bId], 'b gone after it left', LEAVE_BOUND_MS);
  console.log(`info: b left the cluster ${((Date.now() - t0) / 1000).toFixed(2)} s after SIGTERM`);
  assert.match(a.log(), new RegExp(`node ${bId} left the cluster`), 'the master says why b went');

  b = await startNode(dir, models, { name: 'b', args: peer });
  nodes.push(b);
  assert.equal(await nodeId(b), bId, 'the same id from the same data dir');
  const s = await waitState(a, (st) => !!st.nodes[bId], 'b back in the cluster', 60_000 * SLOW);
  assert.equal(Object.keys(s.nodes).length, 2);
  // it stays: the leave of its last run is forgotten once it came back
  await sleep(3000);
  assert.ok((await getState(a)).nodes[bId], 'b still in the cluster 3 s after it rejoined');
  await stop(b);
  await stop(a);
});

test('a master stopped with SIGTERM is taken out by the next master at once', T, async () => {
  const a = await startNode(dir, models, { name: 'ma', args: TIMEOUT });
  nodes.push(a);
  const aId = await nodeId(a);
  await waitState(a, (s) => s.master.node_id === aId, 'a is master');
  const b = await startNode(dir, models, { name: 'mb', args: [...TIMEOUT, '--peer', `127.0.0.1:${clusterPort(a)}`] });
  nodes.push(b);
  const bId = await nodeId(b);
  await waitState(b, (s) => Object.keys(s.nodes).length === 2 && s.master.node_id === aId, 'b follows a');

  const t0 = Date.now();
  await stop(a);
  await waitState(b, (s) => s.master.node_id === bId && !s.nodes[aId] && !!s.nodes[bId],
    'b master, a gone', LEAVE_BOUND_MS);
  console.log(`info: the old master left the new master's state ${((Date.now() - t0) / 1000).toFixed(2)} s after SIGTERM`);
  assert.match(b.log(), new RegExp(`node ${aId} left the cluster`), 'the new master says why a went');
  await stop(b);
});

test('the instances of a node that leaves go with it at once', T, async () => {
  await makeModel(models, 'qwen-leave');
  // a holds no runners, so the instance lands on b
  const a = await startNode(dir, models, { name: 'ia', args: [...TIMEOUT, '--no-worker'] });
  nodes.push(a);
  const aId = await nodeId(a);
  await waitState(a, (s) => s.master.node_id === aId, 'a is master');
  const b = await startNode(dir, models, { name: 'ib', args: [...TIMEOUT, '--peer', `127.0.0.1:${clusterPort(a)}`],
    expectModels: ['qwen-leave'] });
  nodes.push(b);
  const bId = await nodeId(b);
  await waitState(a, (s) => !!s.nodes[bId], 'b in the cluster');
  const { id, inst } = await placeInstance(a, { model_id: 'qwen-leave', min_nodes: 1 });
  assert.equal(inst.shards[0].node_id, bId, 'placed on b');

  await stop(b);
  const s = await waitState(a, (st) => !st.nodes[bId] && !st.instances[id], 'b and its instance gone', LEAVE_BOUND_MS);
  assert.equal(Object.values(s.runners).filter((r) => r.node_id === bId).length, 0, 'no runner of b is left');
  await stop(a);
});
