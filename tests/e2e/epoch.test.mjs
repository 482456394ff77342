// Epochs of a pipelined instance (issue 7, failures): a rank that restarts has lost its
// KV, so the instance moves to a new epoch and all its ranks start again and link anew.
// Two `cairn node` processes on 127.0.0.1 hold the two ranks of a qwen2 model. SIGKILL of
// the rank 1 runner mid-stream: the stream ends with an error, /state shows the same
// instance at a higher epoch with both runners Ready at that epoch (both processes new),
// and greedy answers equal those before the kill. Then the same with rank 0's runner
// killed while idle. A rank killed every time it serves again is given up on (5 in a
// row) and the instance deleted. The nodes stop cleanly, leaving no runner behind.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { SLOW, makeTempDir, removeTempDir, makeModel, startNode, http, sleep, assertStopsCleanly, getState,
  clusterPort, waitState as waitStateFor } from './cairn.mjs';

const MODEL = 'qwen-epoch';
const MAX = 24;
const T = { timeout: 600_000 * SLOW };
const PROMPTS = ['Hello', 'Tell me about cats.', 'What is 2+2?'];
let dir, nodes = [];

// Epoch changes restart every rank: a longer bound than the default.
const waitState = (node, pred, what) => waitStateFor(node, pred, what, 180_000 * SLOW);

// Every rank's runner Ready (or Running) and started for the instance's epoch.
const servingAt = (s, id, epoch) => {
  const inst = s.instances[id];
  return inst && inst.epoch === epoch && inst.shards.every((sh) => {
    const r = s.runners[sh.runner_id];
    return r && ['Ready', 'Running'].includes(r.status) && r.epoch === epoch;
  });
};

function runnerPid(runnerId) {
  for (const n of nodes)
    for (const pid of n.runnerPidsNow())
      if (n.cmdline(pid).includes(runnerId))
        return pid;
  return 0;
}

function client(node) {
  return new OpenAI({ baseURL: `${node.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 * SLOW });
}

async function answers(openai) {
  const out = [];
  for (const p of PROMPTS) {
    const r = await openai.completions.create({ model: MODEL, prompt: p, max_tokens: MAX, temperature: 0,
      ignore_eos: true });
    assert.equal(r.usage.completion_tokens, MAX);
    out.push(r.choices[0].text);
  }
  return out;
}

before(async () => {
  dir = makeTempDir();
  const models = path.join(dir, 'models');
  await makeModel(models, MODEL);
  const a = await startNode(dir, models, { name: 'a', parallel: 4, expectModels: [MODEL], args: ['-t', '1'] });
  nodes.push(a);
  nodes.push(await startNode(dir, models, { name: 'b', parallel: 4, expectModels: [MODEL],
    args: ['-t', '1', '--peer', `127.0.0.1:${clusterPort(a)}`] }));
  await waitState(a, (s) => Object.keys(s.nodes).length === 2, 'two nodes in the cluster');
});

after(async () => {
  for (const n of nodes)
    await n?.stop();
  removeTempDir(dir);
});

test('a rank killed mid-stream moves the instance to a new epoch; every rank restarts and answers stay', T,
  async () => {
    const a = nodes[0];
    const openai = client(a);
    const r = await http(`${a.url}/place_instance`, { body: { model_id: MODEL, sharding: 'pipeline', min_nodes: 2 } });
    assert.equal(r.status, 200, r.text);
    const id = r.json.instance_id;
    let s = await waitState(a, (st) => servingAt(st, id, 1), `instance ${id} serving at epoch 1`);
    const inst = s.instances[id];
    assert.equal(inst.shards.length, 2);
    assert.equal(new Set(inst.shards.map((sh) => sh.node_id)).size, 2, 'one rank per node');
    const want = await answers(openai);
    assert.ok(new Set(want).size > 1, 'different prompts give different answers');

    // SIGKILL of rank 1 mid-stream.
    const pids = inst.shards.map((sh) => runnerPid(sh.runner_id));
    assert.ok(pids.every((p) => p > 0), `both runner processes found: ${pids}`);
    const stream = await openai.completions.create({ model: MODEL, prompt: PROMPTS[1], max_tokens: 4000,
      temperature: 0, ignore_eos: true, stream: true });
    let chunks = 0, failed = null;
    const t0 = Date.now();
    try {
      for await (const c of stream) {
        chunks += c.choices.length;
        if (chunks === 3)
          process.kill(pids[1], 'SIGKILL');
      }
    } catch (e) {
      failed = e;
    }
    assert.ok(chunks >= 3, 'tokens flowed before the kill');
    assert.ok(failed, 'the stream ends with an error, not a normal finish');
    assert.ok(Date.now() - t0 < 60_000 * SLOW, 'the error came within bounds');

    // The same instance, at a higher epoch, with both ranks serving at it in new processes.
    s = await waitState(a, (st) => st.instances[id]?.epoch > 1 && servingAt(st, id, st.instances[id].epoch),
      'the instance serving again at a new epoch');
    const epoch = s.instances[id].epoch;
    const again = s.instances[id].shards.map((sh) => runnerPid(sh.runner_id));
    assert.ok(again.every((p, i) => p > 0 && p !== pids[i]), `both ranks run in new processes: ${pids} -> ${again}`);
    assert.deepEqual(s.instances[id].shards, inst.shards, 'the same shards');
    // The other node applied the same events.
    const sb = await getState(nodes[1]);
    assert.equal(sb.instances[id]?.epoch, epoch, 'node b sees the same epoch');
    assert.deepEqual(await answers(openai), want, 'greedy answers after the new epoch equal those before');

    // Rank 0 killed while idle: rank 1, which only saw its link end, restarts too.
    process.kill(again[0], 'SIGKILL');
    s = await waitState(a, (st) => st.instances[id]?.epoch > epoch && servingAt(st, id, st.instances[id].epoch),
      'the instance serving at the epoch after the kill of rank 0');
    const third = s.instances[id].shards.map((sh) => runnerPid(sh.runner_id));
    assert.ok(third.every((p, i) => p > 0 && p !== again[i]), `both ranks new again: ${again} -> ${third}`);
    assert.deepEqual(await answers(openai), want, 'greedy answers unchanged');
    assert.match(a.log() + nodes[1].log(), /the instance moved to \d+/, 'a worker says why it stopped a runner');

    const d = await http(`${a.url}/instance/${id}`, { method: 'DELETE' });
    assert.equal(d.status, 200, d.text);
    await waitState(a, (st) => !st.instances[id] && !Object.values(st.runners).some((x) => x.instance_id === id),
      'instance gone');
  });

// Each epoch's runners are fresh processes, so the supervisor's count of failures in a
// row would start again every time: the worker carries it (and the restart count) from
// epoch to epoch, so a rank that keeps failing is given up on (5 in a row, the
// supervisor's default) and its instance deleted, instead of moving to new epochs forever.
test('a rank killed each time it serves again: given up on after 5 failures in a row, the instance deleted', T,
  async () => {
    const a = nodes[0];
    const r = await http(`${a.url}/place_instance`, { body: { model_id: MODEL, sharding: 'pipeline', min_nodes: 2 } });
    assert.equal(r.status, 200, r.text);
    const id = r.json.instance_id;
    let kills = 0, epoch = 0;
    for (; kills < 8; kills++) {
      const s = await waitState(a, (st) => !st.instances[id] ||
        (st.instances[id].epoch > epoch && servingAt(st, id, st.instances[id].epoch)),
      `instance ${id} serving at an epoch after ${epoch}, or deleted`);
      if (!s.instances[id])
        break;
      epoch = s.instances[id].epoch;
      const rank1 = s.runners[s.instances[id].shards[1].runner_id];
      assert.ok(rank1.restart_count >= kills, `rank 1's restarts carried over epochs: ${rank1.restart_count} after ${kills} kills`);
      const pid = runnerPid(rank1.runner_id);
      assert.ok(pid > 0);
      process.kill(pid, 'SIGKILL');
    }
    assert.equal(kills, 5, 'deleted after the fifth failure in a row');
    await waitState(a, (st) => !Object.values(st.runners).some((x) => x.instance_id === id), 'its runners gone');
    assert.match(a.log() + nodes[1].log(), /failed 5 times in a row; deleting instance/);
  });

test('the nodes stop cleanly, leaving no runner behind', T, async () => {
  for (const n of nodes.slice().reverse())
    await assertStopsCleanly(n);
});
