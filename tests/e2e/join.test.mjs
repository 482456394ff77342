// Sealing a cluster with one pasted line (issue 16): `cairn seal` makes the first
// machine's secret in its data dir and prints `cairn join TOKEN`; a node started with that
// line joins (the token leaves its command line at once, its secret is kept in the data
// dir), a node without the secret never appears, the joined node comes back sealed after
// a restart without the token, and a malformed or damaged token, or a machine already in
// another cluster, is refused with the reason. Real `cairn` processes on 127.0.0.1 only.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { SLOW, makeTempDir, removeTempDir, startNode, runCairn, getState, waitState, sleep } from './cairn.mjs';

const T = { timeout: 300_000 * SLOW };
let dir, models;
const nodes = [];

async function cairn(args) {
  const r = await runCairn(args);
  return { ...r, stdout: r.stdout.toString() };
}

async function start(name, opts) {
  const n = await startNode(dir, models, { name, ...opts });
  nodes.push(n);
  return n;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

before(() => {
  dir = makeTempDir();
  models = path.join(dir, 'models');
  fs.mkdirSync(models);
});

after(async () => {
  for (const n of nodes)
    await n.stop();
  removeTempDir(dir);
});

const dataDir = (name) => path.join(dir, `${name}-data`);
const secretOf = (name) => fs.readFileSync(path.join(dataDir(name), 'cluster_secret'), 'utf8');
const nodeCount = (s) => Object.keys(s.nodes).length;

test('seal, join, stay sealed; strangers and bad tokens are refused', T, async () => {
  const port = await freePort();
  const sealArgs = ['seal', '--data-dir', dataDir('a'), '--address', `127.0.0.1:${port}`];
  const sealed = await cairn(sealArgs);
  assert.equal(sealed.code, 0, sealed.stderr);
  const m = /cairn join (cairn1-\S+)/.exec(sealed.stdout);
  assert.ok(m, `seal prints the join command: ${sealed.stdout}`);
  const token = m[1];
  assert.match(sealed.stdout, /made in/);
  const st = fs.statSync(path.join(dataDir('a'), 'cluster_secret'));
  assert.equal(st.mode & 0o777, 0o600, 'the secret file is for its owner only');
  assert.match(secretOf('a'), /^[0-9a-f]{64}\n$/, 'a 256-bit random secret');
  const again = await cairn(sealArgs);
  assert.equal(again.code, 0, again.stderr);
  assert.ok(again.stdout.includes(token) && /kept in/.test(again.stdout), 'sealing again keeps the secret');

  // The first node finds its secret in its data dir.
  const a = await start('a', { args: ['--cluster-port', String(port)] });
  assert.equal((await getState(a)).open, false, 'node a is sealed');

  // Bad tokens: refused with the reason, nothing kept.
  for (const [bad, why] of [['nonsense', /starts with 'cairn1-'/], [token.slice(0, -3) + (token.endsWith('A') ? 'BBB' : 'AAA'), /damaged|not whole/],
    [token + '!', /not whole/]]) {
    const r = await cairn(['join', bad, '--data-dir', dataDir('bad')]);
    assert.equal(r.code, 2, `join ${bad.slice(0, 20)}: ${r.stderr}`);
    assert.match(r.stderr, why);
    assert.ok(!fs.existsSync(path.join(dataDir('bad'), 'cluster_secret')), 'no secret kept from a bad token');
  }

  // The second machine joins with the line; the token leaves its command line.
  const b = await start('b', { command: ['join', token] });
  await waitState(a, (s) => nodeCount(s) === 2, 'a and b in one cluster', 30_000 * SLOW);
  const cmdline = fs.readFileSync(`/proc/${b.proc.pid}/cmdline`, 'utf8');
  assert.ok(!cmdline.includes(token.slice(7, 27)), 'the token is not in /proc/PID/cmdline');
  assert.equal(secretOf('b'), secretOf('a'), 'b keeps the cluster secret');
  assert.equal((await getState(b)).open, false, 'node b is sealed');

  // A node without the secret dials a and never appears.
  const c = await start('c', { args: ['--peer', `127.0.0.1:${port}`] });
  await sleep(3000 * SLOW);
  assert.equal(nodeCount(await getState(a)), 2, 'the open node c stayed out');
  assert.equal(nodeCount(await getState(c)), 1, 'and sees only itself');
  assert.equal((await getState(c)).open, true);

  // b restarts without the token: sealed by its data dir, back in the cluster.
  await b.stop();
  await waitState(a, (s) => nodeCount(s) === 1, 'b left', 30_000 * SLOW);
  await start('b', { args: ['--peer', `127.0.0.1:${port}`] });
  await waitState(a, (s) => nodeCount(s) === 2, 'b is back after a restart without the token', 30_000 * SLOW);

  // A machine already in another cluster is not moved silently.
  const other = await cairn(['seal', '--data-dir', dataDir('d'), '--address', '127.0.0.1:1']);
  assert.equal(other.code, 0, other.stderr);
  const r = await cairn(['join', token, '--data-dir', dataDir('d'), '--discovery', 'off']);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /already belongs to another cluster/);
});
