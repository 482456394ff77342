// A runner in trouble (issue 4), with a real `cairn node` on 127.0.0.1 (--discovery
// off): killed with SIGKILL, it is reported Failed with the reason and restarted; one
// that stops answering (SIGSTOP) is killed once its heartbeat timeout passes and
// restarted; one that fails 5 times in a row gets its instance deleted, and the model is
// placed again on the next request. The node then exits 0 on SIGTERM.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, http, sleep, assertStopsCleanly, getState,
  waitState, runnerPid, runnerServing, placeInstance, deleteInstance } from './cairn.mjs';

const MODEL = 'qwen-failures';
const T = { timeout: 240_000 * SLOW };
const HEARTBEAT_S = 30; // the supervisor's heartbeat_timeout_ms default: a silent Ready runner is killed
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

const runnersOf = (s, id) => Object.values(s.runners).filter((r) => r.instance_id === id);

async function complete(node) {
  const r = await http(`${node.url}/v1/completions`,
    { body: { model: MODEL, prompt: 'Hello', max_tokens: 4, temperature: 0 } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices.length, 1);
  return r.json.choices[0].text;
}

// The RunnerStatusUpdated events of runnerId in node's log.
async function runnerEvents(node, runnerId) {
  const r = await http(`${node.url}/events?limit=10000`, { method: 'GET' });
  assert.equal(r.status, 200, r.text);
  return r.json.events.filter((e) => e.kind === 'RunnerStatusUpdated' && e.runner_id === runnerId);
}

test('a runner killed with SIGKILL is reported Failed with the reason and restarted', T, async () => {
  const { id, inst } = await placeInstance(a, { model_id: MODEL });
  const rid = inst.shards[0].runner_id;
  const pid = runnerPid(a, rid);
  assert.ok(pid > 0);
  process.kill(pid, 'SIGKILL');
  const s = await waitState(a, (st) => runnerServing(st.runners[rid]) && st.runners[rid].restart_count === 1 &&
    runnerPid(a, rid) > 0 && runnerPid(a, rid) !== pid, 'restarted once, serving');
  assert.equal(s.instances[id].shards[0].runner_id, rid, 'the same runner id, the same instance');
  const failed = (await runnerEvents(a, rid)).filter((e) => e.status === 'Failed');
  assert.equal(failed.length, 1, `one Failed event: ${JSON.stringify(failed)}`);
  assert.match(failed[0].error ?? '', /SIGKILL/, 'the reason names the signal');
  assert.equal(typeof await complete(a), 'string');
  await deleteInstance(a, id);
});

test('a runner that stops answering is killed and restarted', { timeout: (240_000 + HEARTBEAT_S * 1000) * SLOW },
  async () => {
    const { id, inst } = await placeInstance(a, { model_id: MODEL });
    const rid = inst.shards[0].runner_id;
    const pid = runnerPid(a, rid);
    assert.ok(pid > 0);
    const t0 = Date.now();
    process.kill(pid, 'SIGSTOP');
    await waitState(a, (st) => st.runners[rid]?.restart_count === 1 && runnerServing(st.runners[rid]),
      'the silent runner replaced', (HEARTBEAT_S + 60) * 1000 * SLOW);
    const took = (Date.now() - t0) / 1000;
    assert.ok(took >= HEARTBEAT_S - 1, `not killed before its heartbeat timeout (${took} s)`);
    assert.ok(!fs.existsSync(`/proc/${pid}/cmdline`) || fs.readFileSync(`/proc/${pid}/cmdline`).length === 0,
      'the stopped process is gone');
    const failed = (await runnerEvents(a, rid)).filter((e) => e.status === 'Failed');
    assert.equal(failed.length, 1, `one Failed event: ${JSON.stringify(failed)}`);
    assert.match(failed[0].error ?? '', /no message for \d+ ms/, 'the reason says it went silent');
    assert.equal(typeof await complete(a), 'string');
    await deleteInstance(a, id);
  });

test('after 5 failures in a row the instance is deleted', T, async () => {
  const { id, inst } = await placeInstance(a, { model_id: MODEL });
  const rid = inst.shards[0].runner_id;
  const killed = new Set();
  let gone = false;
  // Each new process of the runner is killed as soon as it exists (restarts back off
  // 1, 2, 4, 8 s); a bound of 12 kills, so a node that never gives up fails the test.
  const until = Date.now() + 120_000 * SLOW;
  while (!gone && killed.size < 12 && Date.now() < until) {
    const pid = runnerPid(a, rid);
    if (pid > 0 && !killed.has(pid)) {
      process.kill(pid, 'SIGKILL');
      killed.add(pid);
    }
    const s = await getState(a);
    gone = !s.instances[id] && runnersOf(s, id).length === 0;
    await sleep(20);
  }
  assert.ok(gone, `the instance is deleted (${killed.size} kills)\n` +
    a.log().split('\n').filter((l) => !l.includes(' info: http ')).slice(-40).join('\n'));
  assert.equal(killed.size, 5, 'it took exactly 5 failures');
  const failed = (await runnerEvents(a, rid)).filter((e) => e.status === 'Failed');
  assert.ok(failed.length >= 1 && failed.length <= 5, `Failed reported: ${failed.length}`);
  assert.equal(runnerPid(a, rid), 0, 'no process of the runner is left');
  const r = await http(`${a.url}/instance/${id}`, { method: 'GET' });
  assert.equal(r.status, 404);
  assert.equal(typeof await complete(a), 'string', 'the model is placed again on demand and answers');
});

test('the node exits 0 on SIGTERM', T, async () => {
  await assertStopsCleanly(a);
  a = null;
});
