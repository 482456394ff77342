// The node's public API as the page uses it: fetch with the API key, SSE read from a
// fetch body (EventSource cannot send a key), and the cluster's state kept current by
// applying the /events stream to one /state read, as every node applies the log.

const KEY = 'cairn.apiKey';
let onAuth = null; // called when a request gets 401; resolves to a new key or null

export function setAuthHandler(fn) { onAuth = fn; }
export function apiKey() { return sessionStorage.getItem(KEY) || ''; }
export function setApiKey(k) {
  if (k) sessionStorage.setItem(KEY, k);
  else sessionStorage.removeItem(KEY);
}

/** An error with the server's message and status. */
export class ApiError extends Error {
  constructor(status, message, missingRoute) {
    super(message);
    this.status = status;
    this.missingRoute = missingRoute; // the node has no such route (an older node)
  }
}

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const k = apiKey();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

async function errorOf(r) {
  let msg = `${r.status} ${r.statusText}`;
  try {
    const j = await r.json();
    const e = j.error;
    msg = typeof e === 'string' ? e : e?.message || msg;
  } catch { /* not JSON */ }
  return new ApiError(r.status, msg, r.status === 404 && /^no route for/.test(msg));
}

/** fetch with the key; retries once after asking for a key on 401. */
export async function raw(path, { method = 'GET', body, signal } = {}) {
  for (let attempt = 0; ; attempt++) {
    const r = await fetch(path, { method, headers: headers(body !== undefined), signal,
      body: body === undefined ? undefined : JSON.stringify(body) });
    if (r.status === 401 && attempt === 0 && onAuth && await onAuth())
      continue;
    if (!r.ok) throw await errorOf(r);
    return r;
  }
}

/** The parsed JSON answer (null for an empty body). */
export async function call(path, opts) {
  const t = await (await raw(path, opts)).text();
  return t ? JSON.parse(t) : null;
}

/** Reads a text body piece by piece: onPiece(text) for each piece that sep ends (and for
 * what is left at the end). */
async function readPieces(body, sep, onPiece) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let m;
    while ((m = sep.exec(buf))) {
      onPiece(buf.slice(0, m.index));
      buf = buf.slice(m.index + m[0].length);
    }
  }
  if (buf.trim()) onPiece(buf);
}

/** Reads an SSE body: onEvent(data, event name) for each event until it ends. */
export function readSSE(body, onEvent) {
  return readPieces(body, /\r?\n\r?\n/, (block) => {
    const data = [];
    let name = 'message';
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      else if (line.startsWith('event:')) name = line.slice(6).trim();
    }
    if (data.length) onEvent(data.join('\n'), name);
  });
}

/** Reads an NDJSON body: onLine(object) for each line. */
export function readNDJSON(body, onLine) {
  return readPieces(body, /\n/, (line) => {
    if (line.trim()) onLine(JSON.parse(line));
  });
}

// ---- the cluster's state ----

const byNodeModel = (d) => `${d.node_id}\u0000${d.model_id}`;

/** Applies one event to state s (the same rules as src/ctl/apply.c); false when s cannot
 * take it (a gap or a snapshot of another shape), and the caller reads /state again. */
export function applyEvent(s, e) {
  const { term, index } = e;
  if (e.kind !== 'StateSnapshot' && s.last_applied && index !== s.last_applied.index + 1 &&
      !(index === 0 && term > s.last_applied.term))
    return index <= s.last_applied.index && term === s.last_applied.term; // old: skip; gap: resync
  switch (e.kind) {
  case 'StateSnapshot':
    Object.assign(s, e.state, { open: s.open });
    break;
  case 'MasterElected':
    s.master = { node_id: e.node_id, term };
    break;
  case 'NodeGatheredInfo':
    s.nodes[e.node_id] = { node_id: e.node_id, info: e.info, last_seen_ms: e.when_ms };
    break;
  case 'NodeTimedOut': {
    const id = e.node_id;
    const onNode = (iid) => s.instances[iid]?.shards.some((sh) => sh.node_id === id);
    for (const t of Object.values(s.tasks))
      if ((t.status === 'Pending' || t.status === 'Running') && onNode(t.instance_id))
        Object.assign(t, { status: 'Failed', error: `node ${id} timed out` });
    for (const [rid, r] of Object.entries(s.runners))
      if (r.node_id === id || onNode(r.instance_id)) delete s.runners[rid];
    for (const iid of Object.keys(s.instances))
      if (onNode(iid)) delete s.instances[iid];
    s.edges = s.edges.filter((x) => x.from !== id && x.to !== id);
    s.downloads = s.downloads.filter((d) => d.node_id !== id);
    delete s.nodes[id];
    break;
  }
  case 'TopologyEdgeCreated': {
    const x = { from: e.from, to: e.to, rtt_us: e.rtt_us, throughput_bytes_per_s: e.throughput_bytes_per_s };
    s.edges = s.edges.filter((y) => y.from !== x.from || y.to !== x.to).concat([x]);
    break;
  }
  case 'TopologyEdgeDeleted':
    s.edges = s.edges.filter((y) => y.from !== e.from || y.to !== e.to);
    break;
  case 'InstanceCreated':
    s.instances[e.instance.instance_id] = e.instance;
    break;
  case 'InstanceDeleted':
    delete s.instances[e.instance_id];
    break;
  case 'InstanceDraftModelUpdated': {
    const i = s.instances[e.instance_id];
    if (i) Object.assign(i, { draft_model: e.draft_model ?? null, num_draft_tokens: e.num_draft_tokens });
    break;
  }
  case 'InstanceEpochAdvanced': {
    const i = s.instances[e.instance_id];
    if (i) i.epoch = e.epoch;
    break;
  }
  case 'RunnerStatusUpdated': {
    const { kind, term: _t, index: _i, ...r } = e;
    if (r.status === 'Shutdown') delete s.runners[r.runner_id];
    else s.runners[r.runner_id] = { ...r, error: r.status === 'Failed' ? r.error : null };
    break;
  }
  case 'RunnerDeleted':
    delete s.runners[e.runner_id];
    break;
  case 'NodeDownloadProgress': {
    const { kind, term: _t, index: _i, ...d } = e;
    s.downloads = s.downloads.filter((x) => byNodeModel(x) !== byNodeModel(d)).concat([d]);
    break;
  }
  case 'TaskCreated':
    s.tasks[e.task_id] = { task_id: e.task_id, task_kind: e.task_kind, instance_id: e.instance_id,
      node_id: e.node_id, status: 'Pending', bytes: e.bytes, error: null };
    break;
  case 'TaskStatusUpdated': {
    const t = s.tasks[e.task_id];
    if (t) Object.assign(t, { status: e.status, error: e.status === 'Failed' ? e.error : null });
    break;
  }
  case 'TaskAcknowledged':
    break;
  case 'TaskDeleted':
    delete s.tasks[e.task_id];
    break;
  default:
    return false; // a kind this page does not know: read the state again
  }
  s.last_applied = { term, index };
  return true;
}

/** Keeps a live copy of the cluster's state: opens /events, reads /state, applies what
 * came meanwhile and then each event. onChange(state, event or null) after each change;
 * onStatus('live' | 'connecting' | message). Returns a stop function. */
export function liveState(onChange, onStatus) {
  let stopped = false, ctl = null;
  const run = async () => {
    while (!stopped) {
      ctl = new AbortController();
      try {
        onStatus('connecting');
        const r = await raw('/events?stream=1', { signal: ctl.signal });
        let state = null;
        const early = [];
        const take = (e) => {
          if (!applyEvent(state, e)) throw new Error('resync');
          onChange(state, e);
        };
        const reading = readSSE(r.body, (data) => {
          const e = JSON.parse(data);
          if (!state) early.push(e);
          else take(e);
        });
        reading.catch(() => {}); // awaited below; a resync before then is handled there
        state = await call('/state', { signal: ctl.signal });
        for (const e of early)
          if (e.term > state.last_applied.term || e.index > state.last_applied.index) take(e);
        onChange(state, null);
        onStatus('live');
        await reading;
      } catch (err) {
        if (stopped) return;
        onStatus(err.message === 'resync' ? 'connecting' : `disconnected: ${err.message}`);
        if (err instanceof ApiError && err.status === 401) return;
      } finally {
        ctl.abort();
      }
      await new Promise((res) => setTimeout(res, 1000));
    }
  };
  run();
  return () => {
    stopped = true;
    ctl?.abort();
  };
}

// ---- /metrics (Prometheus text) ----

/** { name: value } and { name: { label value: value } } for samples with one label. */
export function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[4]);
    if (!m[3]) {
      out[m[1]] = v;
      continue;
    }
    const lab = /^(\w+)="((?:[^"\\]|\\.)*)"/.exec(m[3]);
    if (!lab || m[3].includes(',')) continue;
    (out[m[1]] ??= {})[lab[2]] = v;
  }
  return out;
}
