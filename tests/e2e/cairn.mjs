// Helpers of the end-to-end tests: make models with `cairn mkmodel`, start `cairn node`
// processes on 127.0.0.1 (discovery off, ports picked by the kernel) in a temp dir, wait
// for them with generous bounds, and stop every process they started, on success, on
// failure, and when this process is interrupted.
//
// Environment: CAIRN_BINARY (the cairn executable), CAIRN_SHARED_DIR (holds testdata/),
// CAIRN_SANITIZED=1 (an ASan build: every bound is multiplied).
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const BINARY = process.env.CAIRN_BINARY || path.resolve(here, '../../build/cairn');
export const SHARED = process.env.CAIRN_SHARED_DIR || path.resolve(here, '../../../shared');
export const SANITIZED = process.env.CAIRN_SANITIZED === '1';
/** Multiplier of every time bound: sanitizer builds run several times slower. */
export const SLOW = SANITIZED ? 4 : 1;

export const QWEN_VOCAB = path.join(SHARED, 'testdata/vocab/ggml-vocab-qwen2.gguf');
export const QWEN_TEMPLATE = path.join(SHARED, 'testdata/templates/Qwen-Qwen2.5-7B-Instruct.jinja');

/** A small qwen2-shaped model with random weights: different prompts give different
 * (if repetitive) greedy outputs, and it is quick even under ASan. */
export const SMALL_SHAPE = ['--arch', 'qwen2', '--n-embd', '192', '--n-layers', '4', '--n-head', '6',
  '--n-head-kv', '2', '--n-ff', '512', '--seed', '7'];
/** A small qwen3moe (mixture of experts: 8 experts, 2 per token) of the same vocabulary. */
export const MOE_SHAPE = ['--arch', 'qwen3moe', '--n-embd', '128', '--n-layers', '4', '--n-head', '4',
  '--n-head-kv', '2', '--head-dim', '32', '--n-ff', '256', '--n-expert', '8', '--n-expert-used', '2',
  '--n-ff-exp', '64', '--seed', '7'];
/** The shape of script models: only the embeddings and the head matter. */
export const SCRIPT_SHAPE = ['--arch', 'qwen2', '--n-embd', '128', '--n-layers', '1', '--n-head', '4',
  '--n-head-kv', '2', '--n-ff', '128'];

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The value of promise, or null when it has not settled within ms (the timer is cleared
 * either way, so that nothing keeps this process alive). */
async function settleWithin(promise, ms) {
  let timer;
  const late = new Promise((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Runs the cairn binary to completion; resolves { code, stdout, stderr }. */
export function runCairn(args, { timeoutMs = 120_000 * SLOW, input } = {}) {
  return new Promise((resolve) => {
    const child = execFile(BINARY, args, { timeout: timeoutMs, maxBuffer: 64 << 20, encoding: 'buffer' },
      (err, stdout, stderr) => {
        const code = !err ? 0 : typeof err.code === 'number' ? err.code : -1;
        resolve({ code, error: err, stdout, stderr: stderr.toString() });
      });
    child.stdin.end(input ?? '');
  });
}

const tempDirs = new Set();

/** A fresh temp dir, removed by removeTempDir or, failing that, when this process ends. */
export function makeTempDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cairn-e2e-'));
  tempDirs.add(dir);
  return dir;
}

export function removeTempDir(dir) {
  if (dir && tempDirs.delete(dir))
    fs.rmSync(dir, { recursive: true, force: true });
}

export async function mustRun(args) {
  const r = await runCairn(args);
  if (r.code !== 0)
    throw new Error(`cairn ${args.join(' ')} failed (${r.error}): ${r.stderr}`);
  return r;
}

/** Writes modelsDir/<name>.gguf: a qwen2-shaped model with the Qwen2 vocabulary and the
 * Qwen2.5 chat template (Hermes-style tool calls). */
export async function makeModel(modelsDir, name, shape = SMALL_SHAPE, extra = []) {
  fs.mkdirSync(modelsDir, { recursive: true });
  const out = path.join(modelsDir, `${name}.gguf`);
  await mustRun(['mkmodel', ...shape, '--type', 'q8_0', '--vocab', QWEN_VOCAB, '--chat-template', QWEN_TEMPLATE,
    ...extra, '-o', out]);
  return out;
}

/** Token ids of text in the Qwen2 vocabulary (control tokens such as <|im_end|> parsed). */
export async function tokenIds(text) {
  const r = await mustRun(['tokenize', '-m', QWEN_VOCAB, '--special', '--no-bos', '--ids', text]);
  const line = r.stdout.toString().trim();
  return line ? line.split(/\s+/).map(Number) : [];
}

/** The text the Qwen2.5 template's generation prompt ends with: a script model starts
 * from the prompt's last token, which is this newline. */
export const PROMPT_END = '\n';

/** A script model: greedy decoding after any prompt that ends with PROMPT_END emits the
 * segments' text. Each segment is tokenized on its own and the ids are joined, so a text
 * can be split where its usual tokenization would repeat a token with two different
 * successors (which a script model cannot express; mkmodel says so). */
export async function makeScriptModel(modelsDir, name, segments) {
  const ids = [];
  for (const seg of [PROMPT_END, ...segments])
    ids.push(...await tokenIds(seg));
  return makeModel(modelsDir, name, SCRIPT_SHAPE, ['--script-ids', ids.join(',')]);
}

// ---- nodes ----

const live = new Set(); // nodes not yet stopped

/** pids of pid's children (from /proc/PID/task/TID/children). */
export function childPids(pid) {
  const out = [];
  let tasks = [];
  try {
    tasks = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const t of tasks) {
    try {
      for (const c of fs.readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8').split(/\s+/))
        if (c)
          out.push(Number(c));
    } catch { /* the thread ended */ }
  }
  return out;
}

function isOurRunner(pid) {
  try {
    const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return cmd.includes('runner');
  } catch {
    return false;
  }
}

function killRunners(node) {
  for (const pid of node.runnerPids)
    if (isOurRunner(pid)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch { /* gone */ }
    }
}

// Runners are the node's children; they are noted while the node lives, so that they can
// be killed even if the node dies first.
// And should the test runner that started this process die without killing it, the nodes
// go at once rather than when this process ends.
const parent = process.ppid;
const watcher = setInterval(() => {
  for (const n of live)
    for (const pid of childPids(n.proc.pid))
      n.runnerPids.add(pid);
  if (process.ppid !== parent) {
    killAllNow();
    process.exit(1);
  }
}, 250);
watcher.unref();

function killAllNow() {
  for (const n of live) {
    try {
      n.proc.kill('SIGKILL');
    } catch { /* gone */ }
    killRunners(n);
  }
  live.clear();
  for (const dir of tempDirs)
    fs.rmSync(dir, { recursive: true, force: true });
  tempDirs.clear();
}
process.on('exit', killAllNow);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'])
  process.on(sig, () => {
    killAllNow();
    process.exit(130);
  });

/** Starts `cairn node` on 127.0.0.1 with ports chosen by the kernel, models from
 * modelsDir, its data, logs and XDG dirs in dir. Resolves once /v1/models (asked with
 * apiKey, when the node has one) lists every name in expectModels. The result has url,
 * port, log() and stop(). */
export async function startNode(dir, modelsDir, { parallel, args = [], expectModels = [], name = 'node',
  command = ['node'], apiKey } = {}) {
  const dataDir = path.join(dir, `${name}-data`);
  fs.mkdirSync(dataDir, { recursive: true });
  const logPath = path.join(dir, `${name}.log`);
  const logFd = fs.openSync(logPath, 'a');
  const argv = [...command, '--api-host', '127.0.0.1', '--api-port', '0', '--bind', '127.0.0.1', '--cluster-port', '0',
    '--discovery', 'off', '--models-dir', modelsDir, '--data-dir', dataDir,
    '--bandwidth-mib', '64']; // a short probe: the default reads 1-8 GiB
  if (parallel)
    argv.push('--parallel', String(parallel));
  argv.push(...args);
  const env = { ...process.env, HOME: dir, XDG_DATA_HOME: path.join(dir, 'xdg-data'),
    XDG_CACHE_HOME: path.join(dir, 'xdg-cache') };
  delete env.CAIRN_CLUSTER_SECRET;
  delete env.CAIRN_MODELS_DIR;
  const proc = spawn(BINARY, argv, { stdio: ['ignore', 'pipe', 'pipe'], env });
  const node = { proc, runnerPids: new Set(), logPath, exit: null, port: 0, url: '' };
  live.add(node);
  let text = '';
  const onData = (chunk) => {
    fs.writeSync(logFd, chunk);
    if (!node.port) {
      text += chunk.toString();
      const m = /api 127\.0\.0\.1:(\d+)/.exec(text);
      if (m)
        node.port = Number(m[1]);
    }
  };
  proc.stdout.on('data', onData);
  proc.stderr.on('data', onData);
  node.exited = new Promise((resolve) => proc.on('exit', (code, signal) => {
    node.exit = { code, signal };
    resolve(node.exit);
  }));
  node.exited.then(() => fs.closeSync(logFd));
  node.log = () => {
    try {
      return fs.readFileSync(logPath, 'utf8');
    } catch {
      return '';
    }
  };
  /** The node's runner processes now, and a process's command line ("" once gone). */
  node.runnerPidsNow = () => childPids(proc.pid).filter(isOurRunner);
  node.cmdline = (pid) => {
    try {
      return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      return '';
    }
  };
  node.stop = async () => {
    if (!live.has(node))
      return node.exit;
    for (const pid of childPids(proc.pid))
      node.runnerPids.add(pid);
    if (!node.exit)
      proc.kill('SIGTERM');
    const done = await settleWithin(node.exited, 30_000 * SLOW);
    if (!done) {
      proc.kill('SIGKILL');
      await node.exited;
    }
    // The node stops its runners; one still alive a moment later is killed here.
    const until = Date.now() + 5000 * SLOW;
    while ([...node.runnerPids].some(isOurRunner) && Date.now() < until)
      await sleep(50);
    killRunners(node);
    live.delete(node);
    return done ? node.exit : { code: null, signal: 'SIGKILL (did not stop on SIGTERM)' };
  };

  const fail = async (why) => {
    await node.stop();
    throw new Error(`${why}\n--- ${logPath} ---\n${node.log().slice(-4000)}`);
  };
  const deadline = Date.now() + 30_000 * SLOW;
  while (!node.port) {
    if (node.exit)
      return fail(`cairn node exited (${JSON.stringify(node.exit)}) before listening`);
    if (Date.now() > deadline)
      return fail('cairn node did not report its API port in time');
    await sleep(50);
  }
  node.url = `http://127.0.0.1:${node.port}`;
  const ready = Date.now() + 60_000 * SLOW;
  for (;;) {
    if (node.exit)
      return fail(`cairn node exited (${JSON.stringify(node.exit)}) while starting`);
    try {
      const r = await fetch(`${node.url}/v1/models`, { signal: AbortSignal.timeout(5000 * SLOW),
        headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {} });
      if (r.ok) {
        const ids = new Set((await r.json()).data.map((m) => m.id));
        if (expectModels.every((m) => ids.has(m)))
          break;
      }
    } catch { /* not up yet */ }
    if (Date.now() > ready)
      return fail(`cairn node did not list the models ${expectModels.join(', ')} in time`);
    await sleep(100);
  }
  return node;
}

/** Fetch with a bound; resolves { status, text, json } (json null when not JSON). */
export async function http(url, { method = 'POST', body, headers = {}, timeoutMs = 60_000 * SLOW } = {}) {
  const init = { method, headers: { ...headers }, signal: AbortSignal.timeout(timeoutMs) };
  if (body !== undefined) {
    init.body = typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body);
    if (!init.headers['content-type'])
      init.headers['content-type'] = 'application/json';
  }
  const r = await fetch(url, init);
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch { /* not JSON */ }
  return { status: r.status, text, json, headers: r.headers };
}

/** The value of a Prometheus sample in the node's /metrics ("name{labels}" as written). */
export async function metric(node, sample) {
  const r = await http(`${node.url}/metrics`, { method: 'GET' });
  for (const line of r.text.split('\n'))
    if (line.startsWith(sample + ' '))
      return Number(line.slice(sample.length + 1));
  return NaN;
}

/** Rejects when promise does not settle within ms. */
export function within(ms, promise, what = 'operation') {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

/** Stops the node (SIGTERM) and fails, with the end of its log, unless it exits 0: under
 * ASan a leak or an error found at exit shows here. */
export async function assertStopsCleanly(node) {
  const exit = await node.stop();
  if (!exit || exit.code !== 0)
    throw new Error(`cairn node exited ${JSON.stringify(exit)} on SIGTERM\n--- ${node.logPath} ---\n` +
      node.log().slice(-6000));
}

// ---- the cluster's state and instances ----

/** GET /state of node, parsed (asserts 200). */
export async function getState(node) {
  const r = await http(`${node.url}/state`, { method: 'GET' });
  if (r.status !== 200)
    throw new Error(`GET /state: ${r.status} ${r.text}`);
  return r.json;
}

/** Waits (bounded) until pred(state of node) is true; resolves that state, or throws with
 * the last state and the end of the node's log. */
export async function waitState(node, pred, what, ms = 120_000 * SLOW) {
  const until = Date.now() + ms;
  let s;
  while (Date.now() < until) {
    s = await getState(node);
    if (pred(s))
      return s;
    await sleep(100);
  }
  throw new Error(`${what}: not within ${ms} ms; state: ${JSON.stringify(s).slice(0, 3000)}\n` +
    node.log().split('\n').filter((l) => !l.includes(' info: http ')).slice(-40).join('\n'));
}

/** The cluster port node logged at start. */
export function clusterPort(node) {
  const m = /cluster port (\d+)/.exec(node.log());
  if (!m)
    throw new Error('the node did not log its cluster port');
  return Number(m[1]);
}

/** pid of runner runnerId's process among node's children (its command line names it), or 0. */
export function runnerPid(node, runnerId) {
  for (const pid of node.runnerPidsNow())
    if (node.cmdline(pid).includes(runnerId))
      return pid;
  return 0;
}

export const runnerServing = (r) => !!r && ['Ready', 'Running'].includes(r.status);

/** true when every rank of instance id has a Ready or Running runner in state s. */
export const instanceReady = (s, id) =>
  !!s.instances[id] && s.instances[id].shards.every((sh) => runnerServing(s.runners[sh.runner_id]));

/** POST /place_instance with body, then waits until the instance is ready; resolves
 * { id, inst } (the instance as the state holds it). */
export async function placeInstance(node, body) {
  const r = await http(`${node.url}/place_instance`, { body });
  if (r.status !== 200)
    throw new Error(`place_instance ${JSON.stringify(body)}: ${r.status} ${r.text}`);
  const id = r.json.instance_id;
  const s = await waitState(node, (st) => instanceReady(st, id), `instance ${id} ready`);
  return { id, inst: s.instances[id] };
}

/** DELETE /instance/id, then waits until neither it nor a runner of it is in the state. */
export async function deleteInstance(node, id) {
  const r = await http(`${node.url}/instance/${id}`, { method: 'DELETE' });
  if (r.status !== 200)
    throw new Error(`DELETE /instance/${id}: ${r.status} ${r.text}`);
  await waitState(node, (s) => !s.instances[id] && !Object.values(s.runners).some((x) => x.instance_id === id),
    `instance ${id} gone`);
}

/**
 * Sets `draft` (k = 4) on the instance of `model` and checks that every prompt's answer
 * stays what `alone` holds: one by one (the runner loads the draft between its steps, so
 * the first answers may come before it: asked again until one was drafted, within a
 * minute), then all at once; and that the draft proposed tokens. ask(prompt, withUsage)
 * returns the answer, with `drafted` (usage.draft_tokens) when withUsage.
 */
export async function assertDraftKeepsAnswers(node, model, draft, prompts, alone, ask) {
  const s = await getState(node);
  const id = Object.keys(s.instances).find((k) => s.instances[k].model_id === model);
  assert.ok(id, JSON.stringify(s.instances));
  const r = await http(`${node.url}/instance/${id}/draft_model`,
    { method: 'PUT', body: { draft_model: draft, num_draft_tokens: 4 } });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  let drafted = 0;
  for (let i = 0; i < prompts.length; i++) {
    const deadline = Date.now() + 60_000 * SLOW;
    let got = await ask(prompts[i], true);
    while (got.drafted === 0 && Date.now() < deadline) {
      assert.equal(got.text, alone[i].text, `prompt ${i}`);
      await sleep(200);
      got = await ask(prompts[i], true);
    }
    assert.equal(got.text, alone[i].text, `prompt ${i} with the draft`);
    drafted += got.drafted;
  }
  assert.ok(drafted > 0, 'the draft proposed tokens');
  const together = await Promise.all(prompts.map((p) => ask(p)));
  assert.deepEqual(together, alone, 'all at once with the draft');
}
