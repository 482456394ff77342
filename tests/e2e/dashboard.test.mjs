// The dashboard (issue 18) in a real browser: Debian's chromium, driven by playwright-core,
// against real `cairn node` processes on 127.0.0.1 (discovery off) and the fake hub.
// A two-node cluster shows both nodes (short ids) and their link, the second one's card
// coming from the event stream (the page reads /state once); SIGKILL of one removes its
// card within the node timeout; the hub is searched; a pull cancelled from the page
// leaves no model; a model pulled from the fake hub shows its progress and then appears
// on disk; placing it from its preview makes an instance that becomes ready; a chat typed
// into the page streams a script model's answer and the page shows exactly that text (its
// Markdown rendered, its HTML left as text); the draft model set from the page is the one
// in /state; Stop cancels a long answer (the node counts a cancelled request); hostile
// Markdown renders as text; a node with --api-key gets its key from the page's prompt and
// a cluster with a secret shows sealed; the built-in catalog's cards pull and preview.
// What a test must see sent (POST /download/start of a catalog card) and a stream no
// script model can make (reasoning, tool calls, draft figures) are answered inside the
// browser.
// Screenshots of every page, light and dark, go to CAIRN_ARTIFACTS_DIR (default
// e2e-artifacts/dashboard under the working directory: build/ under ctest).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { SHARED, SLOW, makeTempDir, removeTempDir, startNode, http, waitState, clusterPort, makeModel,
  makeScriptModel, placeInstance, instanceReady, metric, runCairn, sleep, assertStopsCleanly } from './cairn.mjs';
import { startFakeHub } from './fakehub.mjs';

const CHROMIUM = process.env.CAIRN_CHROMIUM || '/usr/bin/chromium';
const T = { timeout: 300_000 * SLOW };
const WAIT = 60_000 * SLOW; // generous bound of each wait for the page
const NODE_TIMEOUT_S = 4;
const ARTIFACTS = process.env.CAIRN_ARTIFACTS_DIR || path.resolve('e2e-artifacts/dashboard');
const ANSWER_SEGMENTS = ['The answer is `42`', ' and <img src=x onerror=alert(1)> stays text.'];
const ANSWER_SHOWN = 'The answer is 42 and <img src=x onerror=alert(1)> stays text.';
const PULLED = 'hf.co/test-org/Tiny-GGUF:Q8_0';

let chromium = null;
try {
  ({ chromium } = await import('playwright-core'));
} catch { /* skipped below */ }
const skip = !chromium ? 'playwright-core is not installed (npm ci in tests/e2e)'
  : !fs.existsSync(CHROMIUM) ? `no browser at ${CHROMIUM} (apt-get install chromium)` : false;

let dir, models, hub, a, b, browser, page;
const nodes = [];
const pageErrors = [];

before(async () => {
  if (skip)
    return;
  dir = makeTempDir();
  models = path.join(dir, 'models');
  await Promise.all([
    makeScriptModel(models, 'answer', [...ANSWER_SEGMENTS, '<|im_end|>']),
    makeScriptModel(models, 'answer-draft', [...ANSWER_SEGMENTS, '<|im_end|>']),
    makeModel(models, 'small'),
  ]);
  const tiny = path.join(dir, 'tiny.gguf');
  const r = await runCairn(['mkmodel', '--shape', 'tiny', '--vocab', path.join(SHARED, 'testdata/vocab/ggml-vocab-llama-spm.gguf'),
    '--type', 'q8_0', '-o', tiny]);
  assert.equal(r.code, 0, r.stderr);
  hub = await startFakeHub({ repos: { 'test-org/Tiny-GGUF': { downloads: 42,
    files: [{ path: 'Tiny-Q8_0.gguf', bytes: fs.readFileSync(tiny) }] } } });
  process.env.HF_ENDPOINT = hub.url;
  process.env.HF_TOKEN = '';
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  const profile = path.join(dir, 'chromium-profile');
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, viewport: { width: 1440, height: 900 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  page = browser.pages()[0] || await browser.newPage();
  page.setDefaultTimeout(WAIT);
  page.on('pageerror', (e) => pageErrors.push(e.message));
  page.on('dialog', (d) => d.accept()); // confirm() of deletes
});

after(async () => {
  await browser?.close();
  for (const n of nodes)
    await n.stop();
  await hub?.close();
  removeTempDir(dir);
});

async function nodeId(node) {
  return (await http(`${node.url}/node_id`, { method: 'GET' })).json.node_id;
}

/** Screenshots of the page now, light and dark. */
async function shots(name) {
  for (const scheme of ['light', 'dark']) {
    await page.emulateMedia({ colorScheme: scheme });
    await sleep(150); // one frame for the new colours
    await page.screenshot({ path: path.join(ARTIFACTS, `${name}-${scheme}.png`) });
  }
  await page.emulateMedia({ colorScheme: 'light' });
}

async function tab(name) {
  await page.click(`#tabs a[data-tab=${name}]`);
  await page.waitForSelector(`#${name}:not([hidden])`);
}

test('the page is served from the binary with its headers', { ...T, skip }, async () => {
  a = await startNode(dir, models, { name: 'a', args: ['--node-timeout', String(NODE_TIMEOUT_S)],
    expectModels: ['answer', 'answer-draft', 'small'] });
  nodes.push(a);
  const r = await fetch(`${a.url}/`, { headers: { 'accept-encoding': 'gzip' } });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/html/);
  assert.match(r.headers.get('content-security-policy'), /default-src 'none'; script-src 'self'/);
  assert.equal(r.headers.get('content-encoding'), 'gzip');
  const etag = r.headers.get('etag');
  assert.match(etag, /^"[0-9a-f]{32}"$/);
  const again = await fetch(`${a.url}/`, { headers: { 'if-none-match': etag } });
  assert.equal(again.status, 304, 'the ETag revalidates');
  const js = await fetch(`${a.url}/assets/app.js`);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  assert.equal((await fetch(`${a.url}/assets/nothing.js`)).status, 404);
});

test('a two-node cluster shows both nodes and their link; a killed node goes', { ...T, skip }, async () => {
  // the page is open before b starts: b's card comes from the event stream
  let stateReads = 0;
  const countReads = (req) => {
    if (new URL(req.url()).pathname === '/state')
      stateReads++;
  };
  page.on('request', countReads);
  await page.goto(`${a.url}/#cluster`);
  await page.waitForSelector('#live.ok');
  b = await startNode(dir, models, { name: 'b', args: ['--node-timeout', String(NODE_TIMEOUT_S),
    '--peer', `127.0.0.1:${clusterPort(a)}`] });
  nodes.push(b);
  const [aId, bId] = [await nodeId(a), await nodeId(b)];
  await waitState(a, (s) => s.nodes[bId] && s.edges.some((e) => e.from === aId && e.to === bId), 'b joined and linked');
  for (const id of [aId, bId]) {
    const card = page.locator(`[data-node="${id}"]`);
    await card.waitFor();
    assert.ok((await card.innerText()).includes(id.slice(0, 8)), `the card of ${id} shows its short id`);
  }
  await page.locator(`[data-link="${aId}>${bId}"]`).waitFor();
  assert.match(await page.locator(`[data-link="${aId}>${bId}"]`).innerText(), /\d+\.\d\d ms/, 'the link shows its RTT');
  assert.match(await page.locator(`[data-node="${aId}"]`).innerText(), /master/, 'a is master');
  assert.match(await page.locator('#sealed').innerText(), /open cluster/);
  await shots('cluster');

  // SIGKILL: b says nothing, and the master times it out
  const t0 = Date.now();
  b.proc.kill('SIGKILL');
  await page.locator(`[data-node="${bId}"]`).waitFor({ state: 'detached', timeout: (NODE_TIMEOUT_S * 1000 + 30_000) * SLOW });
  console.log(`figure: b's card went ${((Date.now() - t0) / 1000).toFixed(1)} s after SIGKILL (node timeout ${NODE_TIMEOUT_S} s)`);
  assert.equal(await page.locator(`[data-link*="${bId}"]`).count(), 0, 'and its links with it');
  page.off('request', countReads);
  assert.equal(stateReads, 1, 'the state was read once, then kept by its events (no polling, no resync)');
  await b.stop();
  nodes.splice(nodes.indexOf(b), 1);
});

test('a model pulled from the fake hub shows progress, then is on disk; its preview places it', { ...T, skip }, async () => {
  await tab('models');
  await page.fill('#model-search', 'Tiny');
  await page.press('#model-search', 'Enter');
  assert.match(await page.locator('[data-repo="test-org/Tiny-GGUF"]').innerText(), /42 downloads/, 'the hub searched');

  // a slow pull cancelled from the page: no model, and the hub stops sending
  hub.throttle = 256 << 10;
  await page.fill('#pull-ref', PULLED);
  await page.click('#pull-go');
  const cancel = page.locator(`[data-download="${PULLED}"] button`, { hasText: 'Cancel' }).first();
  await cancel.click();
  await cancel.waitFor({ state: 'detached' });
  const models = async () => (await http(`${a.url}/models`, { method: 'GET' })).json.models.map((m) => m.id);
  assert.ok(!(await models()).includes(PULLED), 'a cancelled pull leaves no model');
  const sent = hub.storageBytes;
  await sleep(1500);
  assert.ok(hub.storageBytes - sent < 256 << 10, `the hub stopped sending (${hub.storageBytes - sent} bytes in 1.5 s)`);

  hub.throttle = 4 << 20; // ~4 s for the 16 MiB file: its progress can be seen
  await page.click('#pull-go');
  const row = page.locator(`[data-download="${PULLED}"]`).first();
  await row.waitFor();
  await page.waitForFunction((ref) => /[1-9]\d*% · /.test(document.querySelector(`[data-download="${ref}"] .prog`)?.textContent || ''),
    PULLED);
  await shots('models-pulling');
  const text = await row.innerText().catch(() => '');
  console.log(`info: progress row: ${text.replace(/\s+/g, ' ')}`);
  await page.locator(`[data-model="${PULLED}"]`).waitFor();
  await row.waitFor({ state: 'detached' });

  await page.click(`[data-previews="${PULLED}"]`);
  const place = page.locator(`[data-preview="${PULLED}"] [data-place]`).first();
  await place.waitFor();
  assert.match(await page.locator(`[data-preview="${PULLED}"]`).innerText(), /0–\d+ \(\d+\)/, 'layers per node');
  await shots('models-previews');
  // a q8_0 KV cache does not fit heads of 48 values: the preview says so
  await page.selectOption(`[data-preview="${PULLED}"] .kv-select`, 'q8_0');
  await page.locator(`[data-preview="${PULLED}"] .err`, { hasText: 'heads of 48' }).waitFor();
  // a context of 1024: the preview asks again and counts it
  await page.selectOption(`[data-preview="${PULLED}"] .kv-select`, 'f16');
  await page.selectOption(`[data-preview="${PULLED}"] .ctx-select`, '1024');
  const counted = page.locator(`[data-preview="${PULLED}"] .ctx-counted`, { hasText: 'counts 1024 positions' });
  await counted.waitFor();
  // each candidate's decode estimate (the node measured its memory bandwidth at start),
  // and the best of each sharding side by side
  assert.match(await page.locator(`[data-preview="${PULLED}"] td.estimate`).first().innerText(), /^[\d.]+ tok\/s$/);
  assert.match(await page.locator(`[data-preview="${PULLED}"] .estimates`).innerText(),
    /pipeline: [\d.]+ tok\/s · tensor: [\d.]+ tok\/s/);
  const ctx = 1024;
  await page.locator(`[data-preview="${PULLED}"] [data-place]`).first().click();
  await page.waitForSelector('#instances:not([hidden])');
  const s = await waitState(a, (st) => Object.values(st.instances).some((i) => i.model_id === PULLED &&
    instanceReady(st, i.instance_id)), 'the pulled model placed and ready');
  const inst = Object.values(s.instances).find((i) => i.model_id === PULLED);
  assert.equal(inst.cache_type_k, undefined, 'f16, the default');
  assert.equal(inst.ctx_len, ctx, 'the context the preview counted');
  const card = page.locator(`[data-instance="${inst.instance_id}"]`);
  await card.locator('.pill.st-Ready, .pill.st-Running').waitFor();
  assert.match(await card.innerText(), /Ready|Running/);
  assert.match(await card.innerText(), new RegExp(`${ctx} positions · K f16, V f16`));
  await http(`${a.url}/instance/${inst.instance_id}`, { method: 'DELETE' });
  await card.waitFor({ state: 'detached' });
});

test('a chat streams the script model\'s answer; the page shows exactly that text', { ...T, skip }, async () => {
  const { id } = await placeInstance(a, { model_id: 'answer' });
  await tab('chat');
  await page.selectOption('#chat-model', 'answer');
  await page.fill('#chat-input', 'What is the answer?');
  await page.press('#chat-input', 'Enter');
  const content = page.locator('.msg.assistant .content').last();
  await page.locator('#send:not([hidden])').waitFor();
  assert.equal((await content.textContent()).trim(), ANSWER_SHOWN);
  assert.equal(await content.locator('code').textContent(), '42', 'Markdown code is rendered');
  assert.equal(await content.locator('img').count(), 0, 'the model\'s HTML is text');
  assert.match(await page.locator('.msg.assistant .figures').last().textContent(), /first token [\d.]+ s/);
  // kept in the browser's storage
  await page.reload();
  await tab('chat');
  assert.equal((await page.locator('.msg.assistant .content').last().textContent()).trim(), ANSWER_SHOWN);
  await shots('chat');

  // the node counts the instance's tokens, for its tokens/s on the page
  assert.ok(await metric(a, `cairn_instance_completion_tokens_total{instance="${id}"}`) > 0, 'per-instance tokens');

  // the draft model, from the instances page
  await tab('instances');
  const card = page.locator(`[data-instance="${id}"]`);
  await card.waitFor();
  await card.locator('select.draft-model').selectOption('answer-draft');
  await card.locator('input.num-draft').fill('3');
  await card.locator('button.apply-draft').click();
  await waitState(a, (s) => s.instances[id]?.draft_model === 'answer-draft' && s.instances[id].num_draft_tokens === 3,
    'the draft model set from the page');
  await page.waitForFunction((iid) => /answer-draft · 3 tokens/.test(document.querySelector(`[data-instance="${iid}"] .draft-now`)?.textContent || ''), id);
  await shots('instances');
});

test('Stop cancels a long answer', { ...T, skip }, async () => {
  await placeInstance(a, { model_id: 'small' });
  const cancelled = await metric(a, 'cairn_requests_total{outcome="cancelled"}');
  await tab('chat');
  await page.selectOption('#chat-model', 'small');
  await page.fill('#chat-max_tokens', '3000');
  await page.dispatchEvent('#chat-max_tokens', 'change');
  await page.fill('#chat-input', 'Tell me a very long story.');
  await page.press('#chat-input', 'Enter');
  await page.waitForFunction(() => (document.querySelector('.msg.assistant:last-child .content')?.textContent || '').length > 20);
  await page.click('#stop');
  await page.locator('#send:not([hidden])').waitFor();
  assert.match(await page.locator('.msg.assistant .figures').last().textContent(), /stopped/);
  const until = Date.now() + WAIT;
  while (await metric(a, 'cairn_requests_total{outcome="cancelled"}') <= cancelled && Date.now() < until)
    await sleep(100);
  assert.ok(await metric(a, 'cairn_requests_total{outcome="cancelled"}') > cancelled, 'the node cancelled the request');
  await shots('chat-stopped');
  await tab('metrics');
  await page.locator('.chart polyline').first().waitFor({ state: 'attached' });
  await shots('metrics');
});

test('the built-in catalog: its cards, a pull through /download/start, placements of a card', { ...T, skip }, async () => {
  // The node's own GET /catalog; POST /download/start is answered here (the fake hub has
  // no such repo), to see what the page sends.
  const started = [];
  await page.route('**/download/start', (r) => {
    started.push(JSON.parse(r.request().postData()));
    return r.fulfill({ status: 202, contentType: 'application/json', body: '{}' });
  });
  try {
    await page.goto(`${a.url}/?fresh#models`); // a new page: it asks for the routes again
    const card = page.locator('[data-card="bartowski/Llama-3.2-1B-Instruct-GGUF"]');
    await card.waitFor();
    assert.match(await card.innerText(), /Llama 3\.2 1B Instruct/);
    assert.match(await card.innerText(), /Q4_K_M ≈\d/);
    await card.locator('button[title^="pull Q4_K_M"]').click();
    await page.waitForFunction(() => document.querySelector('#toasts')?.textContent.includes('pulling'));
    assert.deepEqual(started, [{ model: 'hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M', node_id: await nodeId(a) }]);
    await card.locator('button[title^="where Q4_K_M"]').click();
    // the node asks the (fake) hub for the header: candidates, or why none
    await page.locator('[data-preview="hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M"]').waitFor();
    await shots('models-catalog');
  } finally {
    await page.unrouteAll();
  }
});

test('reasoning shows collapsed, tool calls show, and an answer\'s drafted/accepted tokens', { ...T, skip }, async () => {
  // An OpenAI stream as a reasoning model with tools and a draft model sends it, answered
  // in the browser (no script model can say all of it): the page's rendering of each part.
  const chunk = (delta, extra = {}) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', model: 'answer',
    choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;
  const body = chunk({ role: 'assistant', content: '' }) + chunk({ reasoning_content: 'First, <b>weigh</b> it.' }) +
    chunk({ content: 'Calling the **tool**.' }) +
    chunk({ tool_calls: [{ index: 0, id: 't1', type: 'function', function: { name: 'get_weather', arguments: '{"city":' } }] }) +
    chunk({ tool_calls: [{ index: 0, function: { arguments: ' "Paris"}' } }] }) +
    `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] })}\n\n` +
    `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: [],
      usage: { prompt_tokens: 9, completion_tokens: 12, draft_tokens: 8, accepted_draft_tokens: 6 } })}\n\n` +
    'data: [DONE]\n\n';
  await page.route('**/v1/chat/completions', (r) => r.fulfill({ status: 200, contentType: 'text/event-stream', body }));
  try {
    await page.goto(`${a.url}/?chat#chat`);
    await page.locator('#chat-model option').first().waitFor({ state: 'attached' });
    await page.click('.chats button.primary'); // a new conversation
    await page.fill('#chat-input', 'Weather in Paris?');
    await page.press('#chat-input', 'Enter');
    const msg = page.locator('.msg.assistant').last();
    await msg.locator('.figures').waitFor();
    const details = msg.locator('details.reasoning');
    assert.equal(await details.getAttribute('open'), null, 'reasoning is collapsed');
    assert.equal((await details.locator('.md').textContent()).trim(), 'First, <b>weigh</b> it.');
    assert.equal((await msg.locator('.content').textContent()).trim(), 'Calling the tool.');
    assert.equal(await msg.locator('.tool strong').textContent(), 'get_weather');
    assert.equal(await msg.locator('.tool pre').textContent(), '{"city": "Paris"}');
    assert.match(await msg.locator('.figures').textContent(), /12 tokens .*drafted 8, accepted 6 \(75%\).*finish: tool_calls/);
    await shots('chat-reasoning-tools');
  } finally {
    await page.unrouteAll();
  }
});

test('the Markdown renderer makes text of hostile input', { ...T, skip }, async () => {
  await page.goto(`${a.url}/#chat`);
  const got = await page.evaluate(async () => {
    const { markdown } = await import('/assets/md.js');
    const cases = ['<script>window.pwned=1</script>', '<img src=x onerror="window.pwned=1">',
      '[click](javascript:window.pwned=1)', '**<b>bold</b>**', '```html\n<script>x</script>\n```',
      '```js\nlet s = "unclosed', '| a | b |\n|---|---|\n| <i>1</i> | `2` |', '> <svg onload=alert(1)>',
      '- [x](https://example.com/"onmouseover="alert(1))'];
    return cases.map((text) => {
      const div = document.createElement('div');
      div.append(markdown(text));
      document.body.append(div);
      const r = { text, shown: div.textContent, tags: [...div.querySelectorAll('*')].map((e) => e.tagName.toLowerCase()),
        hrefs: [...div.querySelectorAll('a')].map((x) => x.getAttribute('href')),
        handlers: [...div.querySelectorAll('*')].some((e) => [...e.attributes].some((at) => /^on/i.test(at.name))) };
      div.remove();
      return r;
    }).concat([{ pwned: !!window.pwned }]);
  });
  for (const r of got.slice(0, -1)) {
    assert.ok(!r.tags.some((t) => ['script', 'img', 'svg', 'b', 'i', 'iframe'].includes(t)), `${r.text}: tags ${r.tags}`);
    assert.ok(!r.handlers, `${r.text}: no event handler attribute`);
    assert.ok(r.hrefs.every((h) => /^https?:\/\//.test(h)), `${r.text}: links ${r.hrefs}`);
  }
  assert.equal(got.at(-1).pwned, false);
  assert.equal(got[3].shown, '<b>bold</b>', 'HTML inside bold is text');
  assert.ok(got[4].tags.includes('pre') && got[4].shown.includes('<script>x</script>'), 'fenced HTML is code text');
  assert.ok(got[5].tags.includes('pre'), 'an unclosed fence (a stream mid-way) is code already');
  assert.ok(got[6].tags.includes('table') && got[6].shown.includes('<i>1</i>'), 'a table, its cells text');
});

test('with --api-key the page asks for the key once; a cluster with a secret shows sealed', { ...T, skip }, async () => {
  const secret = path.join(dir, 'cluster-secret');
  fs.writeFileSync(secret, 'dashboard-e2e-secret\n', { mode: 0o600 });
  const k = await startNode(dir, models, { name: 'k', args: ['--api-key', 'sesame', '--cluster-secret-file', secret],
    apiKey: 'sesame' });
  nodes.push(k);
  await page.goto(`${k.url}/#cluster`);
  await page.locator('#keydlg[open]').waitFor();
  await page.fill('#keyin', 'sesame');
  await page.click('#keydlg button');
  await page.waitForSelector('#live.ok');
  await page.locator(`[data-node="${await http(`${k.url}/node_id`, { method: 'GET', headers: { authorization: 'Bearer sesame' } })
    .then((r) => r.json.node_id)}"]`).waitFor();
  assert.match(await page.locator('#sealed').innerText(), /sealed cluster/, 'a cluster with a secret is sealed');
  await page.reload();
  await page.waitForSelector('#live.ok'); // kept for the session: no second prompt
  assert.equal(await page.locator('#keydlg[open]').count(), 0);
  assert.deepEqual(pageErrors, [], 'no script error on the page');
});

test('the nodes the page used stop cleanly (under ASan: no leak, no error)', { ...T, skip }, async () => {
  await browser.close();
  browser = null;
  for (const n of [...nodes]) {
    await assertStopsCleanly(n);
    nodes.splice(nodes.indexOf(n), 1);
  }
});
