// Garbage on every port a `cairn node` or its runners listen on (issue 4): the HTTP API
// with its file transfer route, the ZeroMQ cluster port (not ZMTP, bad greetings, a NULL
// handshake then messages that are not the node's protocol or too large), and a
// pipelined runner's data port; the node, its runners (same processes, no restart) and
// their answers stay as they were. A --no-api --no-worker node joins, offers no memory,
// reports no API and is never placed on. SIGINT stops the runners, flushes the log and
// exits 0. Nodes on 127.0.0.1 with --discovery off.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { BINARY, SLOW, makeTempDir, removeTempDir, makeModel, startNode, http, within, assertStopsCleanly, childPids,
  getState, waitState, clusterPort, runnerPid, runnerServing, instanceReady, placeInstance, deleteInstance }
  from './cairn.mjs';

const MODEL = 'qwen-garbage';
const T = { timeout: 240_000 * SLOW };
let dir, models, a;

before(async () => {
  dir = makeTempDir();
  models = path.join(dir, 'models');
  await makeModel(models, MODEL);
  a = await startNode(dir, models, { name: 'a', expectModels: [MODEL] });
});

after(async () => {
  await a?.stop();
  removeTempDir(dir);
});

async function complete(node) {
  const r = await http(`${node.url}/v1/completions`,
    { body: { model: MODEL, prompt: 'Hello', max_tokens: 4, temperature: 0 } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices.length, 1);
  return r.json.choices[0].text;
}

// Sends bytes to 127.0.0.1:port, reads what comes back for up to ms (or until the peer
// closes), then closes; resolves the bytes received.
function poke(port, bytes, ms = 500) {
  return new Promise((resolve) => {
    const chunks = [];
    const sock = net.connect(port, '127.0.0.1');
    const done = () => {
      clearTimeout(timer);
      sock.destroy();
      resolve(Buffer.concat(chunks));
    };
    const timer = setTimeout(done, ms * SLOW);
    sock.on('connect', () => sock.write(bytes));
    sock.on('data', (d) => chunks.push(d));
    sock.on('error', done);
    sock.on('close', done);
  });
}

// Deterministic junk.
function junk(n, seed) {
  const b = Buffer.alloc(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    b[i] = x & 0xff;
  }
  return b;
}

// A ZMTP 3.x greeting (64 bytes) with the given mechanism and version.
function zmtpGreeting(mechanism = 'NULL', major = 3, minor = 0) {
  const g = Buffer.alloc(64);
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = major;
  g[11] = minor;
  g.write(mechanism, 12, 'ascii');
  return g;
}

// A ZMTP READY command naming the socket type.
function zmtpReady(type = 'DEALER') {
  const name = Buffer.from('\x05READY', 'latin1');
  const key = Buffer.from('\x0bSocket-Type', 'latin1');
  const len = Buffer.alloc(4);
  len.writeUInt32BE(type.length);
  const body = Buffer.concat([name, key, len, Buffer.from(type)]);
  return Buffer.concat([Buffer.from([0x04, body.length]), body]);
}

const frame = (flags, payload) => Buffer.concat([Buffer.from([flags, payload.length]), payload]);

test('garbage on the API, its file transfer route and the cluster port: the node, its runner and answers stay', T,
  async () => {
    const { id, inst } = await placeInstance(a, { model_id: MODEL });
    const rid = inst.shards[0].runner_id;
    const pid = runnerPid(a, rid);
    assert.ok(pid > 0, 'the runner process is found');
    const before = await complete(a);

    // The HTTP API port: not HTTP, broken HTTP, and requests cut short.
    const api = a.port;
    const httpJunk = [
      junk(4096, 1),
      Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]), // a TLS ClientHello start
      Buffer.from('GET /state HTTP/1.1\r\nContent-Length: -5\r\n\r\n'),
      Buffer.from('GET /state HTTP/9.9\r\n\r\n'),
      Buffer.from(`GET /${'a'.repeat(200_000)} HTTP/1.1\r\n\r\n`),
      Buffer.from(`GET /state HTTP/1.1\r\nX: ${'b'.repeat(200_000)}\r\n\r\n`),
      Buffer.from('GET /state HTTP/1.1\r\nHost: x\0y\r\n\r\n'),
      Buffer.from('POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"model":'),
      Buffer.from('POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n'),
      Buffer.from('POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n'),
      Buffer.concat([Buffer.from('GET /state HTTP/1.1\r\n'), junk(512, 2)]),
    ];
    for (const [i, bytes] of httpJunk.entries()) {
      const reply = await poke(api, bytes);
      if (reply.length) // whatever comes back is an HTTP reply (libmicrohttpd takes a NUL in a header value)
        assert.match(reply.toString('latin1', 0, 12), /^HTTP\/1\.[01] [1-5]\d\d/,
          `API garbage ${i}: ${reply.toString('latin1', 0, 80)}`);
    }

    // The file transfer route: bad ranges, bad auth headers, paths that are not a model.
    const file = `${a.url}/files/models/${MODEL}`;
    const size = fs.statSync(path.join(models, `${MODEL}.gguf`)).size;
    const ranges = ['bytes=abc', 'bytes=5-2', `bytes=${size}-`, 'bytes=99999999999999999999999-', 'bytes=-0',
      'bytes=0-1,4-5', 'lines=0-1', 'bytes=--1', 'bytes= 0-1'];
    for (const range of ranges) {
      const r = await http(file, { method: 'GET', headers: { range } });
      assert.ok([200, 206, 400, 416].includes(r.status), `Range ${range}: ${r.status} ${r.text.slice(0, 200)}`);
      if (r.status === 206)
        assert.ok(Number(r.headers.get('content-length')) < size, `Range ${range}: a part, not the whole`);
    }
    const ok = await http(file, { method: 'GET', headers: { range: 'bytes=0-3' } });
    assert.equal(ok.status, 206, 'a good range still works');
    assert.equal(ok.text, 'GGUF');
    for (const p of ['/files/models/..%2F..%2Fetc%2Fpasswd', '/files/models/', '/files/models/%00', '/files/models/nope',
      `/files/models/${MODEL}/x`, `/files/models/${'m'.repeat(5000)}`]) {
      const r = await http(`${a.url}${p}`, { method: 'GET' });
      assert.ok(r.status >= 400 && r.status < 500, `${p}: ${r.status}`);
    }
    const authJunk = await http(file, { method: 'HEAD', headers: { 'x-cairn-node': 'z'.repeat(300), 'x-cairn-auth': '%%' } });
    assert.ok(authJunk.status < 500, `auth junk: ${authJunk.status}`);

    // The ZeroMQ cluster port: not ZMTP, bad greetings, and a well-formed NULL handshake
    // followed by messages that are not the node's protocol or too large to take.
    const cport = clusterPort(a);
    const zmtpJunk = [
      junk(2048, 3),
      zmtpGreeting('NULL', 2, 0),
      zmtpGreeting('CURVE'),
      zmtpGreeting('PLAIN'),
      Buffer.concat([zmtpGreeting('NULL'), junk(256, 4)]),
      Buffer.concat([zmtpGreeting('NULL'), zmtpReady('PUB'), frame(0, Buffer.from('x'))]),
      Buffer.concat([zmtpGreeting('NULL'), zmtpReady(), frame(0, Buffer.from('hello')), frame(1, Buffer.alloc(0)),
        frame(0, junk(200, 5)), frame(0, Buffer.from('{"type":"hello","node_id":"../../x"}'))]),
      Buffer.concat([zmtpGreeting('NULL'), zmtpReady(), Buffer.from([0x02, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])]),
      Buffer.concat([zmtpGreeting('NULL'), zmtpReady(), Buffer.from([0x04, 0x03, 0x02, 0x41, 0x42])]),
    ];
    for (const bytes of zmtpJunk)
      await poke(cport, bytes, 300);

    // Still one node, serving; the same runner answers the same text.
    const s = await getState(a);
    assert.deepEqual(Object.keys(s.nodes), [(await http(`${a.url}/node_id`, { method: 'GET' })).json.node_id]);
    assert.ok(runnerServing(s.runners[rid]), `the runner is still serving: ${JSON.stringify(s.runners[rid])}`);
    assert.equal(s.runners[rid].restart_count ?? 0, 0);
    assert.equal(runnerPid(a, rid), pid, 'the same runner process');
    assert.equal(await complete(a), before, 'the same answer after the garbage');
    await deleteInstance(a, id);
  });

test('a --no-api --no-worker node joins, offers no memory, serves no API and is never placed on', T, async () => {
  const cdir = path.join(dir, 'c-data');
  fs.mkdirSync(cdir, { recursive: true });
  const logPath = path.join(dir, 'c.log');
  const logFd = fs.openSync(logPath, 'w');
  const env = { ...process.env, HOME: dir, XDG_DATA_HOME: path.join(dir, 'xdg-data'),
    XDG_CACHE_HOME: path.join(dir, 'xdg-cache') };
  delete env.CAIRN_CLUSTER_SECRET;
  delete env.CAIRN_MODELS_DIR;
  const known = Object.keys((await getState(a)).nodes);
  const c = spawn(BINARY, ['node', '--no-api', '--no-worker', '--bind', '127.0.0.1', '--cluster-port', '0',
    '--discovery', 'off', '--models-dir', models, '--data-dir', cdir, '--peer', `127.0.0.1:${clusterPort(a)}`],
  { stdio: ['ignore', logFd, logFd], env });
  const exited = new Promise((resolve) => c.on('exit', (code, signal) => resolve({ code, signal })));
  const log = () => fs.readFileSync(logPath, 'utf8');
  try {
    const s = await waitState(a, (st) => Object.keys(st.nodes).length === known.length + 1, 'the --no-api node joined',
      60_000 * SLOW);
    const cid = Object.keys(s.nodes).find((k) => !known.includes(k));
    assert.equal(s.nodes[cid].info.api_port, 0, 'it reports no API port');
    assert.equal(s.nodes[cid].info.memory_available_bytes, 0, 'it offers no memory (no worker)');
    assert.match(log(), /api \(none\)/, 'its start line says it serves no API');
    assert.match(log(), /worker off/, 'and runs no worker');
    assert.deepEqual(childPids(c.pid), [], 'it has no child process (runner)');
    const pv = await http(`${a.url}/instance/previews?model_id=${MODEL}`, { method: 'GET' });
    assert.equal(pv.status, 200, pv.text);
    const withC = pv.json.candidates.filter((k) => JSON.stringify(k.nodes).includes(cid));
    assert.ok(withC.length >= 1, 'candidates with it are listed');
    for (const k of withC)
      assert.ok(!k.accepted && typeof k.reason === 'string' && k.reason.length, `refused with a reason: ${JSON.stringify(k)}`);
    const two = await http(`${a.url}/place_instance`, { body: { model_id: MODEL, sharding: 'pipeline', min_nodes: 2 } });
    assert.equal(two.status, 409, `two nodes with one that runs nothing: ${two.status} ${two.text}`);
    c.kill('SIGTERM');
    const exit = await within(30_000 * SLOW, exited, 'the exit on SIGTERM');
    assert.deepEqual(exit, { code: 0, signal: null }, log().slice(-3000));
  } finally {
    c.kill('SIGKILL');
    await exited;
    fs.closeSync(logFd);
  }
});

test('garbage on a pipelined runner\'s data port: the ranks and their answers stay', T, async () => {
  const b = await startNode(dir, models, { name: 'b', expectModels: [MODEL],
    args: ['--peer', `127.0.0.1:${clusterPort(a)}`] });
  try {
    const bid = (await http(`${b.url}/node_id`, { method: 'GET' })).json.node_id;
    await waitState(a, (s) => !!s.nodes[bid], 'node b joined');
    const { id, inst } = await placeInstance(a, { model_id: MODEL, sharding: 'pipeline', min_nodes: 2 });
    assert.equal(inst.shards.length, 2);
    const s = await getState(a);
    const ranks = inst.shards.map((sh) => s.runners[sh.runner_id]);
    const pids = inst.shards.map((sh) => runnerPid(a, sh.runner_id) || runnerPid(b, sh.runner_id));
    assert.ok(pids.every((p) => p > 0), `the rank processes are found: ${pids}`);
    const ports = ranks.map((r) => r.data_port).filter((p) => p > 0);
    assert.ok(ports.length >= 1, `a rank reports its data port: ${JSON.stringify(ranks)}`);
    const before = await complete(a);
    for (const port of ports) {
      for (let seed = 1; seed <= 4; seed++)
        await poke(port, junk(64 << seed, seed), 300);
      await poke(port, Buffer.alloc(4096), 300); // zeros: a frame header of nothing
      await poke(port, Buffer.from('GET / HTTP/1.1\r\n\r\n'), 300);
      await poke(port, Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]), 300); // a huge length
    }
    const after = await getState(a);
    for (const sh of inst.shards) {
      const r = after.runners[sh.runner_id];
      assert.ok(runnerServing(r), `rank ${sh.rank} still serving: ${JSON.stringify(r)}`);
      assert.equal(r.restart_count ?? 0, 0, `rank ${sh.rank} not restarted`);
    }
    assert.deepEqual(inst.shards.map((sh) => runnerPid(a, sh.runner_id) || runnerPid(b, sh.runner_id)), pids,
      'the same rank processes');
    assert.equal(await complete(a), before, 'the same answer after the garbage');
    await deleteInstance(a, id);
  } finally {
    await assertStopsCleanly(b);
  }
});

test('SIGINT: the runners stop, the log is flushed, the node exits 0', T, async () => {
  // An explicit instance on this node: nodes stopped above stay in the state until their
  // timeout, and a placement could pick one of them.
  const aid = (await http(`${a.url}/node_id`, { method: 'GET' })).json.node_id;
  const card = (await http(`${a.url}/models`, { method: 'GET' })).json.models.find((m) => m.id === MODEL);
  const shards = [{ node_id: aid, layer_begin: 0, layer_end: card.n_layers }];
  const r = await http(`${a.url}/instance`, { body: { instance: { instance_id: 'sigint', model_id: MODEL, shards } } });
  assert.equal(r.status, 200, r.text);
  await waitState(a, (st) => instanceReady(st, 'sigint'), 'instance sigint ready');
  const pids = a.runnerPidsNow();
  assert.ok(pids.length >= 1, 'a runner runs');
  a.proc.kill('SIGINT');
  const exit = await within(30_000 * SLOW, a.exited, 'the exit on SIGINT');
  assert.deepEqual(exit, { code: 0, signal: null }, a.log().slice(-4000));
  // The node waited for its runners: none is left (a zombie has no command line).
  const left = pids.filter((p) => fs.existsSync(`/proc/${p}/cmdline`) && fs.readFileSync(`/proc/${p}/cmdline`).length);
  assert.deepEqual(left, [], 'no runner outlives the node');
  const log = fs.readFileSync(path.join(dir, 'a-data', 'node.log'), 'utf8');
  assert.match(log, /SIGINT, stopping/, 'the log file has the stop line');
  assert.ok(log.endsWith('\n'), 'the log ends with a whole line');
  await a.stop();
  a = null;
});
