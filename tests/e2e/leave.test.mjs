// A node that stops cleanly says bye on its links, and the master takes it out of the
// cluster at once instead of after --node-timeout (120 s here, longer than the test's
// bound); started again from the same data dir, it rejoins under the same id. Real
// `cairn node` processes on 127.0.0.1 with --discovery off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { SLOW, makeTempDir, removeTempDir, startNode, http, assertStopsCleanly, getState, waitState,
  clusterPort } from './cairn.mjs';

const T = { timeout: 300_000 * SLOW };
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
  return typeof r.json === 'string' ? r.json : r.json.node_id;
}

test('a node that stops cleanly leaves the cluster at once, and rejoins when started again', T, async () => {
  const timeout = ['--node-timeout', '120'];
  const a = await startNode(dir, models, { name: 'a', args: timeout });
  nodes.push(a);
  const peer = [...timeout, '--peer', `127.0.0.1:${clusterPort(a)}`];
  let b = await startNode(dir, models, { name: 'b', args: peer });
  nodes.push(b);
  const bId = await nodeId(b);
  await waitState(a, (s) => Object.keys(s.nodes).length === 2 && !!s.nodes[bId], 'b in the cluster');

  const t0 = Date.now();
  await assertStopsCleanly(b);
  nodes = nodes.filter((n) => n !== b);
  // well within the 120 s node timeout
  await waitState(a, (s) => !s.nodes[bId], 'b gone after its bye', 20_000 * SLOW);
  const gone = (Date.now() - t0) / 1000;
  assert.match(a.log(), new RegExp(`node ${bId} said bye`), 'the master says why b left');
  console.log(`info: b left the cluster ${gone.toFixed(2)} s after SIGTERM`);

  b = await startNode(dir, models, { name: 'b', args: peer });
  nodes.push(b);
  assert.equal(await nodeId(b), bId, 'the same id from the same data dir');
  const s = await waitState(a, (st) => !!st.nodes[bId], 'b back in the cluster', 60_000 * SLOW);
  assert.equal(Object.keys(s.nodes).length, 2);
  // it stays: the bye of its last run does not time it out again
  await new Promise((resolve) => setTimeout(resolve, 3000));
  assert.ok((await getState(a)).nodes[bId], 'b still in the cluster 3 s after it rejoined');
});
