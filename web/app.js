// cairn's dashboard: the cluster, models, instances, chat and metrics of the node that
// serves it, through the node's public API only (see api.js).
import { call, raw, readSSE, readNDJSON, liveState, parseMetrics, setAuthHandler, setApiKey, ApiError } from './api.js';
import { h, markdown } from './md.js';

const $ = (id) => document.getElementById(id);
const ui = {
  state: null,        // the cluster's state, kept live from /events
  self: '',           // this node's id
  models: [],         // GET /models
  catalog: null,      // GET /catalog (null: the node has no catalog route)
  hub: [],            // the last hub search
  query: '',
  previews: {},       // model id -> { sharding, draft, data, error, open }
  pulls: {},          // "node\0model" -> a pull this page runs through /api/pull
  routes: {},         // route -> false once the node answered "no route"
  samples: [],        // /metrics samples of the last minutes
  tab: 'cluster',
};

// ---- small helpers ----

export const shortId = (id) => (id || '').slice(0, 8);
function fmtBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  for (; Math.abs(n) >= 1024 && i < u.length - 1; i++) n /= 1024;
  return `${n.toFixed(i && Math.abs(n) < 10 ? 1 : 0)} ${u[i]}`;
}
const fmtRate = (n) => (n ? `${fmtBytes(n)}/s` : '–');
function fmtSecs(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return '–';
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}
const fmtNum = (n, d = 1) => (Number.isFinite(n) ? n.toFixed(d) : '–');
function nodeName(id) {
  const n = ui.state?.nodes[id];
  return n ? `${n.info?.hostname || 'node'} · ${shortId(id)}` : shortId(id);
}
function toast(msg, kind = 'error') {
  const t = h('div', { class: `toast ${kind}`, role: 'status' }, msg);
  $('toasts').append(t);
  setTimeout(() => t.remove(), kind === 'error' ? 8000 : 4000);
}
function fill(el, ...kids) {
  el.replaceChildren();
  for (const k of kids.flat(Infinity)) if (k !== null && k !== undefined && k !== false)
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
}
const svg = (tag, attrs, ...kids) => {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const k of kids.flat()) el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return el;
};
const serving = (r) => !!r && (r.status === 'Ready' || r.status === 'Running');
function instanceStatus(inst) {
  const rs = inst.shards.map((sh) => ui.state.runners[sh.runner_id]);
  if (rs.every(serving)) return rs.some((r) => r.status === 'Running') ? 'Running' : 'Ready';
  const failed = rs.find((r) => r?.status === 'Failed');
  if (failed) return 'Failed';
  return rs.find((r) => r && !serving(r))?.status || 'Pending';
}
/** Calls a route that an older node may not have; null when it has not. */
async function optional(path, opts) {
  const key = `${opts?.method || 'GET'} ${path.split('?')[0]}`;
  if (ui.routes[key] === false) return null;
  try {
    return await call(path, opts);
  } catch (e) {
    if (e instanceof ApiError && e.missingRoute) {
      ui.routes[key] = false;
      return null;
    }
    throw e;
  }
}

// ---- tabs, theme, key ----

function showTab(tab) {
  if (!document.getElementById(tab)?.classList.contains('view')) tab = 'cluster';
  ui.tab = tab;
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== tab;
  for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('on', a.dataset.tab === tab);
  if (tab === 'models') loadModels();
  render();
  if (tab === 'chat') $('chat-input')?.focus();
}

function initTheme() {
  const set = (t) => {
    if (t) document.documentElement.dataset.theme = t;
    else delete document.documentElement.dataset.theme;
  };
  set(localStorage.getItem('cairn.theme'));
  $('theme').addEventListener('click', () => {
    const dark = document.documentElement.dataset.theme === 'dark' ||
      (!document.documentElement.dataset.theme && matchMedia('(prefers-color-scheme: dark)').matches);
    const t = dark ? 'light' : 'dark';
    localStorage.setItem('cairn.theme', t);
    set(t);
    renderMetrics();
  });
}

let asking = null;
function askKey() {
  asking ??= new Promise((resolve) => {
    const dlg = $('keydlg');
    $('keyin').value = '';
    dlg.onclose = () => {
      const k = $('keyin').value.trim();
      setApiKey(k);
      asking = null;
      resolve(!!k);
    };
    dlg.showModal();
  });
  return asking;
}

// ---- rendering ----

let pending = false;
function render() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    if (!ui.state) return;
    const s = ui.state;
    fill($('summary'), `${Object.keys(s.nodes).length} nodes · ${Object.keys(s.instances).length} instances`);
    if (ui.tab === 'cluster') renderCluster();
    else if (ui.tab === 'models') renderModels();
    else if (ui.tab === 'instances') renderInstances();
    else if (ui.tab === 'chat') renderChatModels();
    else if (ui.tab === 'metrics') renderMetrics();
  });
}

// ---- cluster ----

function graph(s) {
  const ids = Object.keys(s.nodes).sort();
  const W = 520, H = 260, cx = W / 2, cy = H / 2, R = ids.length > 1 ? 90 : 0;
  const pos = {};
  ids.forEach((id, i) => {
    const a = Math.PI + (2 * Math.PI * i) / ids.length; // two nodes side by side
    pos[id] = [cx + 1.6 * R * Math.cos(a), cy + R * Math.sin(a)];
  });
  const pairs = new Map();
  for (const e of s.edges) {
    if (!pos[e.from] || !pos[e.to]) continue;
    const k = [e.from, e.to].sort().join('|');
    pairs.set(k, [...(pairs.get(k) || []), e]);
  }
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'graph', role: 'img', 'aria-label': 'nodes and links' });
  for (const [k, es] of pairs) {
    const [a, b] = k.split('|');
    const [x1, y1] = pos[a], [x2, y2] = pos[b];
    const rtt = Math.min(...es.map((e) => e.rtt_us));
    const bw = Math.max(...es.map((e) => e.throughput_bytes_per_s || 0));
    g.append(svg('line', { x1, y1, x2, y2, class: 'edge' }),
      svg('text', { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 6, class: 'edge-label', 'text-anchor': 'middle' },
        `${(rtt / 1000).toFixed(2)} ms${bw ? ` · ${fmtRate(bw)}` : ''}`));
  }
  for (const id of ids) {
    const [x, y] = pos[id];
    const master = s.master.node_id === id;
    g.append(svg('g', { class: `gnode${master ? ' master' : ''}` },
      svg('circle', { cx: x, cy: y, r: 20 }),
      svg('text', { x, y: y + 4, 'text-anchor': 'middle', class: 'gcount' },
        String(Object.values(s.runners).filter((r) => r.node_id === id).length)),
      svg('text', { x, y: y + 36, 'text-anchor': 'middle' }, s.nodes[id].info?.hostname || 'node'),
      svg('text', { x, y: y + 50, 'text-anchor': 'middle', class: 'mono' }, shortId(id) + (master ? ' ★' : ''))));
  }
  return g;
}

function renderCluster() {
  const s = ui.state;
  const ids = Object.keys(s.nodes).sort();
  const cards = ids.map((id) => {
    const n = s.nodes[id], info = n.info || {};
    const total = info.memory_total_bytes || 0, avail = info.memory_available_bytes || 0;
    const used = total - avail;
    const runners = Object.values(s.runners).filter((r) => r.node_id === id);
    const dls = s.downloads.filter((d) => d.node_id === id && d.status !== 'Completed');
    return h('article', { class: 'card node', 'data-node': id },
      h('header', null,
        h('strong', null, info.hostname || 'node'),
        h('code', { class: 'nid', title: id }, id.slice(0, 12)),
        s.master.node_id === id ? h('span', { class: 'pill accent' }, 'master') : null,
        id === ui.self ? h('span', { class: 'pill' }, 'this node') : null),
      h('div', { class: 'bar', title: `${fmtBytes(used)} used of ${fmtBytes(total)}` },
        h('i', { style: `width:${total ? Math.round((100 * used) / total) : 0}%` })),
      h('dl', { class: 'kv' },
        h('dt', null, 'memory'), h('dd', null, `${fmtBytes(used)} used · ${fmtBytes(avail)} offered · ${fmtBytes(total)} total`),
        h('dt', null, 'cpu'), h('dd', null, `${info.cpu_cores ?? '–'} cores · ${info.cpu_model || ''}`),
        h('dt', null, 'disk'), h('dd', null, `${fmtBytes(info.disk_free_bytes)} free of ${fmtBytes(info.disk_total_bytes)}`),
        h('dt', null, 'api'), h('dd', null, `:${info.api_port ?? '–'} · cluster :${info.cluster_port ?? '–'}`)),
      h('div', { class: 'holds' },
        runners.length ? runners.map((r) => {
          const inst = s.instances[r.instance_id];
          const sh = inst?.shards.find((x) => x.runner_id === r.runner_id);
          return h('div', { class: 'hold' }, h('span', { class: `dot ${r.status}` }),
            `${inst?.model_id || '?'} `, sh ? h('span', { class: 'muted' }, `layers ${sh.layer_begin}–${sh.layer_end}`) : null,
            h('span', { class: 'muted' }, ` ${r.status}`));
        }) : h('span', { class: 'muted' }, 'holds no model'),
        onDisk(id),
        dls.map((d) => h('div', { class: 'hold' }, '↓ ', d.model_id, ' ', h('span', { class: 'muted' }, pct(d))))));
  });
  const links = s.edges.filter((e) => s.nodes[e.from] && s.nodes[e.to]).map((e) =>
    h('tr', { 'data-link': `${e.from}>${e.to}` }, h('td', null, nodeName(e.from)), h('td', null, '→'),
      h('td', null, nodeName(e.to)), h('td', { class: 'num' }, `${(e.rtt_us / 1000).toFixed(2)} ms`),
      h('td', { class: 'num' }, e.throughput_bytes_per_s ? fmtRate(e.throughput_bytes_per_s) : 'measuring')));
  fill($('cluster'),
    h('div', { class: 'row wrap' },
      h('span', { class: `pill ${s.open ? 'warn' : 'ok'}`, id: 'sealed',
        title: s.open ? 'No cluster secret: any machine on the network may join' : 'Links are encrypted and authenticated' },
      s.open ? 'open cluster' : 'sealed cluster'),
      h('span', { class: 'muted' }, `master ${s.master.node_id ? nodeName(s.master.node_id) : 'none'} (term ${s.master.term})`),
      h('span', { class: 'muted' }, `log at ${s.last_applied.term}:${s.last_applied.index}`)),
    h('div', { class: 'split' },
      h('div', { class: 'panel' }, h('h2', null, 'Topology'), graph(s)),
      h('div', { class: 'panel' }, h('h2', null, 'Links'),
        links.length ? h('table', { class: 'grid', id: 'links' },
          h('thead', null, h('tr', null, h('th', null, 'from'), h('th'), h('th', null, 'to'), h('th', { class: 'num' }, 'RTT'),
            h('th', { class: 'num' }, 'throughput'))), h('tbody', null, links))
          : h('p', { class: 'muted' }, 'No links: a cluster of one.'))),
    h('h2', null, `Nodes (${ids.length})`),
    h('div', { class: 'cards', id: 'nodes' }, cards));
}

/** The models on a node's disk, as a line of the card. */
function onDisk(id) {
  const ids = ui.models.filter((m) => (m.nodes || []).includes(id)).map((m) => m.id);
  return ids.length ? h('div', { class: 'hold muted disk' }, `on disk: ${ids.join(', ')}`) : null;
}

function pct(d) {
  const p = d.bytes_total ? Math.floor((100 * d.bytes_done) / d.bytes_total) : 0;
  return `${d.status} ${p}% · ${fmtBytes(d.bytes_done)} of ${fmtBytes(d.bytes_total)} · ${fmtRate(d.bytes_per_s)} · ETA ${fmtSecs(d.eta_s)}`;
}

// ---- models ----

let modelsLoading = null;
function loadModels() {
  modelsLoading ??= (async () => {
    try {
      ui.models = (await call('/models')).models || [];
      const cat = await optional(`/catalog?q=${encodeURIComponent(ui.query)}`);
      ui.catalog = cat ? cat.models || [] : null;
    } catch (e) {
      toast(`models: ${e.message}`);
    } finally {
      modelsLoading = null;
      render();
    }
  })();
  return modelsLoading;
}

/** Models that can draft for m: the same vocabulary size and architecture family, smaller. */
function draftsFor(id) {
  const m = ui.models.find((x) => x.id === id);
  if (!m) return [];
  return ui.models.filter((d) => d.id !== id && !d.error && d.vocab_size === m.vocab_size && d.bytes <= m.bytes)
    .map((d) => d.id);
}

async function loadPreview(id) {
  const p = ui.previews[id] ??= { sharding: 'pipeline', draft: '', open: true };
  p.loading = true;
  render();
  const q = new URLSearchParams({ model_id: id, sharding: p.sharding });
  if (p.draft) q.set('draft_model', p.draft);
  for (const [k, v] of Object.entries(kvAsked(p))) q.set(k, v);
  // the other sharding too, for its best candidate's speed beside this one's
  const other = new URLSearchParams(q);
  other.set('sharding', p.sharding === 'tensor' ? 'pipeline' : 'tensor');
  try {
    const [data, alt] = await Promise.all([call(`/instance/previews?${q}`),
      call(`/instance/previews?${other}`).catch(() => null)]);
    p.data = data;
    p.other = alt;
    p.error = null;
  } catch (e) {
    p.data = null;
    p.error = e.message;
  }
  p.loading = false;
  render();
}

/** A candidate's estimated decode speed of one stream, as text. */
function fmtEstimate(est) {
  if (!est) return '';
  if (est.unknown) return '?';
  return `${est.tokens_per_s >= 10 ? est.tokens_per_s.toFixed(0) : est.tokens_per_s.toFixed(1)} tok/s`;
}

/** "pipeline: 40 tok/s · tensor: 70 tok/s": the best accepted candidate of each sharding. */
function bestEstimates(p) {
  const parts = [];
  for (const d of [p.data, p.other]) {
    const c = d && d.best >= 0 ? d.candidates[d.best] : null;
    if (c?.estimate && !c.estimate.unknown) parts.push(`${d.sharding}: ${fmtEstimate(c.estimate)}`);
  }
  return parts.length ? `best of each, one stream: ${parts.join(' · ')}` : '';
}

/** The KV cache a preview asks for: a context (none: the trained one where it fits) and
 * K and V types (none: f16). */
function kvAsked(p) {
  const kv = {};
  if (p.ctx) kv.ctx_len = Number(p.ctx);
  if (p.kvType && p.kvType !== 'f16') kv.cache_type_k = kv.cache_type_v = p.kvType;
  return kv;
}

async function place(id, candidate) {
  const p = ui.previews[id] || {};
  try {
    let r;
    if (!candidate) {
      const body = { model_id: id, sharding: p.sharding || 'pipeline', ...kvAsked(p) };
      if (p.draft) body.draft_model = p.draft;
      r = await call('/place_instance', { method: 'POST', body });
    } else {
      const n = candidate.shares.length;
      // the context the preview counted, so the runners hold what placement counted
      r = await call('/instance', { method: 'POST', body: { instance: { model_id: id, sharding: p.sharding || 'pipeline',
        draft_model: p.draft || null, num_draft_tokens: 4, ...kvAsked(p), ctx_len: p.data?.ctx_len || undefined,
        shards: candidate.shares.map((sh) => ({ node_id: sh.node, rank: sh.rank, world_size: n,
          layer_begin: sh.layer_begin, layer_end: sh.layer_end })) } } });
    }
    toast(`placed ${id} as instance ${shortId(r.instance_id)}`, 'ok');
    location.hash = '#instances';
  } catch (e) {
    toast(`place ${id}: ${e.message}`);
  }
}

function previewPanel(id) {
  const p = ui.previews[id];
  if (!p?.open) return null;
  const drafts = draftsFor(id);
  const d = p.data;
  const cands = d?.candidates || [];
  return h('tr', { class: 'preview', 'data-preview': id }, h('td', { colspan: 7 },
    h('div', { class: 'row wrap' },
      h('label', null, 'sharding ', h('select', { onchange: (e) => { p.sharding = e.target.value; loadPreview(id); } },
        ['pipeline', 'tensor'].map((x) => h('option', { value: x, selected: p.sharding === x }, x)))),
      h('label', null, 'draft model ', h('select', { class: 'draft-select', onchange: (e) => { p.draft = e.target.value; loadPreview(id); } },
        h('option', { value: '' }, drafts.length ? 'none' : 'none (no model shares its vocabulary)'),
        drafts.map((x) => h('option', { value: x, selected: p.draft === x }, x)))),
      h('label', null, 'context ', h('select', { class: 'ctx-select', onchange: (e) => { p.ctx = e.target.value; loadPreview(id); } },
        h('option', { value: '' }, 'trained, where it fits'),
        [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072].map((x) => h('option', { value: x, selected: Number(p.ctx) === x }, String(x))))),
      h('label', null, 'KV cache ', h('select', { class: 'kv-select', onchange: (e) => { p.kvType = e.target.value; loadPreview(id); } },
        ['f16', 'q8_0', 'q4_0'].map((x) => h('option', { value: x, selected: (p.kvType || 'f16') === x }, x)))),
      h('button', { class: 'primary', 'data-place-best': id, onclick: () => place(id) }, 'Place best'),
      d?.ctx_len ? h('span', { class: 'muted ctx-counted' }, `counts ${d.ctx_len} positions a sequence`) : null,
      d ? h('span', { class: 'muted estimates' }, bestEstimates(p)) : null,
      p.loading ? h('span', { class: 'muted' }, 'asking the cluster…') : null,
      p.error ? h('span', { class: 'err' }, p.error) : null),
    d ? h('table', { class: 'grid' },
      h('thead', null, h('tr', null, h('th', null, ''), h('th', null, 'nodes'), h('th', null, 'layers per node'),
        h('th', { class: 'num' }, 'memory after'), h('th', { class: 'num', title: 'one stream, estimated from the nodes\' memory bandwidth and the links' }, 'decode'),
        h('th', null, 'verdict'), h('th'))),
      h('tbody', null, cands.map((c, i) => h('tr', { class: c.accepted ? '' : 'refused' },
        h('td', null, i === d.best ? h('span', { class: 'pill accent' }, 'best') : ''),
        h('td', null, c.nodes.map(shortId).join(' + ')),
        h('td', null, c.shares.map((sh) => `${shortId(sh.node)}: ${sh.layer_begin}–${sh.layer_end} (${sh.layer_end - sh.layer_begin})`).join(' · ')),
        h('td', { class: 'num' }, c.shares.map((sh) => fmtBytes(sh.free - sh.need.total)).join(' · ')),
        h('td', { class: 'num estimate', title: c.estimate?.unknown || (c.estimate ? `reading weights ${c.estimate.compute_ms.toFixed(2)} ms, links ${c.estimate.link_ms.toFixed(2)} ms a token (${c.estimate.exchanges} exchanges)` : '') },
          fmtEstimate(c.estimate)),
        h('td', null, c.accepted ? 'fits' : h('span', { class: 'err' }, c.reason || 'refused')),
        h('td', null, c.accepted && c.executable !== false
          ? h('button', { 'data-place': `${id}#${i}`, onclick: () => place(id, c) }, 'Place') : null)))))
      : null));
}

/** The downloads to show: the cluster's (from the state) that have not completed, and
 * the pulls this page runs (which it can cancel by ending their stream). */
function downloadsOf() {
  const rows = new Map();
  for (const p of Object.values(ui.pulls)) rows.set(`${p.node_id}\u0000${p.model_id}`, p);
  for (const d of ui.state.downloads) {
    if (d.status === 'Completed') continue;
    const k = `${d.node_id}\u0000${d.model_id}`;
    rows.set(k, { ...d, via: rows.has(k) ? 'pull' : 'cluster' });
  }
  return [...rows.values()];
}

async function pull(ref, nodeId) {
  ref = ref.trim();
  if (!ref) return;
  nodeId ||= ui.self;
  const started = await optional('/download/start', { method: 'POST', body: { model: ref, node_id: nodeId } })
    .catch((e) => {
      toast(`pull ${ref}: ${e.message}`);
      return false;
    });
  if (started !== null) {
    if (started !== false) toast(`pulling ${ref} onto ${nodeName(nodeId)}`, 'ok');
    return;
  }
  if (nodeId !== ui.self) {
    toast(`this node can pull only onto itself (${nodeName(ui.self)})`);
    return;
  }
  // Ollama's /api/pull on this node: progress from its stream; cancel by ending it.
  const key = `${nodeId}\u0000${ref}`;
  if (ui.pulls[key]) return;
  const p = ui.pulls[key] = { node_id: nodeId, model_id: ref, bytes_done: 0, bytes_total: 0, bytes_per_s: 0,
    eta_s: null, status: 'Pending', via: 'pull', ctl: new AbortController(), t0: performance.now() };
  render();
  let last = { t: performance.now(), b: 0 };
  try {
    const r = await raw('/api/pull', { method: 'POST', body: { model: ref, stream: true }, signal: p.ctl.signal });
    await readNDJSON(r.body, (j) => {
      if (j.error) throw new Error(j.error);
      p.status = j.status === 'success' ? 'Completed' : 'Ongoing';
      if (j.total) {
        const now = performance.now();
        if (now - last.t > 500) {
          const rate = ((j.completed - last.b) * 1000) / (now - last.t);
          p.bytes_per_s = p.bytes_per_s ? 0.75 * p.bytes_per_s + 0.25 * rate : rate;
          last = { t: now, b: j.completed };
        }
        p.bytes_done = j.completed;
        p.bytes_total = j.total;
        p.eta_s = p.bytes_per_s > 0 ? (j.total - j.completed) / p.bytes_per_s : null;
      }
      if (j.model) p.final = j.model;
      render();
    });
    toast(`pulled ${p.final || ref}`, 'ok');
  } catch (e) {
    toast(e.name === 'AbortError' ? `pull of ${ref} cancelled` : `pull ${ref}: ${e.message}`,
      e.name === 'AbortError' ? 'ok' : 'error');
  } finally {
    delete ui.pulls[key];
    loadModels();
  }
}

async function cancelPull(d) {
  if (d.via === 'pull') return ui.pulls[`${d.node_id}\u0000${d.model_id}`]?.ctl.abort();
  try {
    await call('/download/cancel', { method: 'POST', body: { model: d.model_id, node_id: d.node_id } });
  } catch (e) {
    toast(`cancel: ${e.message}`);
  }
}

async function removeModel(id, nodeId) {
  if (!confirm(`Delete ${id} from ${nodeName(nodeId)}?`)) return;
  try {
    const r = await optional('/download/delete', { method: 'POST', body: { model: id, node_id: nodeId } });
    if (r === null) {
      if (nodeId !== ui.self) throw new Error(`this node can delete only its own files (${nodeName(ui.self)})`);
      await call('/api/delete', { method: 'DELETE', body: { model: id } });
    }
    toast(`deleted ${id}`, 'ok');
  } catch (e) {
    toast(`delete ${id}: ${e.message}`);
  }
  loadModels();
}

async function searchHub() {
  if (!ui.query.trim()) return;
  try {
    ui.hub = (await call(`/hub/search?q=${encodeURIComponent(ui.query.trim())}&limit=20`)).models || [];
    if (!ui.hub.length) toast('the hub has no GGUF repo of that name', 'ok');
  } catch (e) {
    toast(`hub: ${e.message}`);
  }
  render();
}

function nodeSelect(cls) {
  return h('select', { class: cls, title: 'the node that gets the model' },
    Object.keys(ui.state.nodes).sort().map((id) => h('option', { value: id, selected: id === ui.self }, nodeName(id))));
}

let modelsFocus = null;
function renderModels() {
  const el = $('models');
  const focused = document.activeElement;
  modelsFocus = focused && el.contains(focused) && focused.id ? { id: focused.id, pos: focused.selectionStart } : null;
  const q = ui.query.toLowerCase();
  const local = ui.models.filter((m) => !q || m.id.toLowerCase().includes(q) || (m.name || '').toLowerCase().includes(q));
  const dl = downloadsOf();
  // previews asked for models that no node has (a catalog card, a hub reference)
  const remote = Object.keys(ui.previews).filter((id) => ui.previews[id].open && !ui.models.some((m) => m.id === id));
  const pullIn = h('input', { id: 'pull-ref', placeholder: 'hf.co/OWNER/REPO:Q4_K_M', size: 40, value: ui.pullRef || '',
    oninput: (e) => { ui.pullRef = e.target.value; } });
  const pullNode = nodeSelect('pull-node');
  pullNode.value = ui.pullNode && ui.state.nodes[ui.pullNode] ? ui.pullNode : ui.self;
  pullNode.addEventListener('change', () => { ui.pullNode = pullNode.value; });
  fill(el,
    h('div', { class: 'row wrap' },
      h('input', { id: 'model-search', type: 'search', placeholder: 'search models, catalog and hub…', value: ui.query,
        oninput: (e) => { ui.query = e.target.value; render(); },
        onkeydown: (e) => { if (e.key === 'Enter') { searchHub(); loadModels(); } } }),
      h('button', { onclick: () => { searchHub(); loadModels(); } }, 'Search the hub'),
      h('span', { class: 'spacer' }),
      pullIn, pullNode,
      h('button', { class: 'primary', id: 'pull-go', onclick: () => pull(pullIn.value, pullNode.value) }, 'Pull')),
    dl.length ? h('div', { class: 'panel' }, h('h2', null, 'Downloads'),
      h('table', { class: 'grid', id: 'downloads' }, h('tbody', null, dl.map((d) => h('tr', { 'data-download': d.model_id },
        h('td', null, d.model_id), h('td', null, nodeName(d.node_id)),
        h('td', { class: 'wide' }, h('div', { class: 'bar' }, h('i', { style: `width:${d.bytes_total ? Math.floor((100 * d.bytes_done) / d.bytes_total) : 0}%` }))),
        h('td', { class: 'num prog' }, pct(d)),
        h('td', null, d.status === 'Ongoing' || d.status === 'Pending'
          ? h('button', { class: 'ghost', onclick: () => cancelPull(d) }, 'Cancel') : (d.error ? h('span', { class: 'err' }, d.error) : '')))))))
      : null,
    h('div', { class: 'panel' }, h('h2', null, `On disk (${local.length})`),
      h('table', { class: 'grid', id: 'local-models' },
        h('thead', null, h('tr', null, ['model', 'arch', 'size', 'layers', 'context', 'nodes', ''].map((x) => h('th', null, x)))),
        h('tbody', null, local.map((m) => [h('tr', { 'data-model': m.id },
          h('td', null, h('strong', null, m.id), m.error ? h('div', { class: 'err' }, m.error) : null),
          h('td', null, m.architecture || '–'), h('td', { class: 'num' }, fmtBytes(m.model_bytes ?? m.bytes)),
          h('td', { class: 'num' }, m.n_layers ?? '–'), h('td', { class: 'num' }, m.context_length ?? '–'),
          h('td', null, [...new Set(m.nodes || [])].map((n) => h('span', { class: 'chip' }, shortId(n),
            h('button', { class: 'x', title: `delete from ${nodeName(n)}`, onclick: () => removeModel(m.id, n) }, '×')))),
          h('td', null, h('button', { 'data-previews': m.id, onclick: () => {
            const p = ui.previews[m.id];
            if (p?.open) { p.open = false; render(); } else loadPreview(m.id);
          } }, ui.previews[m.id]?.open ? 'Hide' : 'Placements'))),
        previewPanel(m.id)]))),
      !local.length ? h('p', { class: 'muted' }, 'No model matches. Pull one from the hub.') : null),
    remote.length ? h('div', { class: 'panel' }, h('h2', null, 'Placements of models not on disk'),
      h('table', { class: 'grid', id: 'remote-previews' }, h('tbody', null, remote.map((id) => [
        h('tr', null, h('td', { colspan: 6 }, h('strong', null, id)),
          h('td', null, h('button', { onclick: () => { ui.previews[id].open = false; render(); } }, 'Hide'))),
        previewPanel(id)])))) : null,
    ui.catalog ? h('div', { class: 'panel' }, h('h2', null, 'Catalog'),
      h('table', { class: 'grid', id: 'catalog' }, h('tbody', null, ui.catalog.filter((c) => !q ||
        `${c.name} ${c.repo} ${c.arch}`.toLowerCase().includes(q)).map((c) => h('tr', { 'data-card': c.repo },
        h('td', null, h('strong', null, c.name), h('div', { class: 'muted' }, c.repo),
          c.gated ? h('span', { class: 'pill warn' }, 'gated') : null),
        h('td', null, c.arch || ''), h('td', { class: 'num' }, c.params_b ? `${c.params_b}B` : ''),
        h('td', { class: 'num' }, c.n_layers ? `${c.n_layers} layers` : ''),
        h('td', { class: 'num' }, c.context_length ?? ''),
        h('td', null, (c.quants || []).map((qq) => h('span', { class: 'chip', title: 'size estimated from the parameters' },
          `${qq.tag} ≈${fmtBytes(qq.approx_bytes)}`,
          h('button', { class: 'link', title: `pull ${qq.tag} onto the chosen node`,
            onclick: () => pull(qq.ref, pullNode.value) }, 'pull'),
          h('button', { class: 'link', title: `where ${qq.tag} would go`,
            onclick: () => loadPreview(qq.ref) }, 'placements')))))))))
      : null,
    ui.hub.length ? h('div', { class: 'panel' }, h('h2', null, 'Hugging Face hub'),
      h('table', { class: 'grid', id: 'hub' }, h('tbody', null, ui.hub.map((r) => h('tr', { 'data-repo': r.id },
        h('td', null, h('strong', null, r.id), r.gated ? h('span', { class: 'pill warn' }, 'gated') : null),
        h('td', { class: 'num' }, `${r.downloads ?? 0} downloads`),
        h('td', null, h('button', { onclick: () => { ui.pullRef = pullIn.value = `hf.co/${r.id}`; pullIn.focus(); } }, 'Choose'),
          ' ', h('button', { onclick: () => loadPreview(`hf.co/${r.id}`) }, 'Placements'),
          ' ', h('button', { class: 'primary', onclick: () => pull(`hf.co/${r.id}`, pullNode.value) }, 'Pull'))))))) : null);
  if (modelsFocus) {
    const f = document.getElementById(modelsFocus.id);
    f?.focus();
    if (f && modelsFocus.pos !== null && modelsFocus.pos !== undefined) f.setSelectionRange?.(modelsFocus.pos, modelsFocus.pos);
  }
}

// ---- instances ----

async function setDraft(id, draft, n) {
  try {
    await call(`/instance/${id}/draft_model`, { method: 'PUT', body: { draft_model: draft || null, num_draft_tokens: n } });
    toast(draft ? `instance ${shortId(id)} drafts with ${draft}` : `instance ${shortId(id)} drafts no more`, 'ok');
  } catch (e) {
    toast(`draft model: ${e.message}`);
  }
}

async function deleteInstance(id) {
  if (!confirm(`Delete instance ${shortId(id)}?`)) return;
  try {
    await call(`/instance/${id}`, { method: 'DELETE' });
  } catch (e) {
    toast(`delete: ${e.message}`);
  }
}

function rate(name, label) { // per second between the last two samples
  const [a, b] = ui.samples.slice(-2);
  if (!a || !b) return NaN;
  const va = label ? a.m[name]?.[label] : a.m[name], vb = label ? b.m[name]?.[label] : b.m[name];
  return (vb - va) / ((b.t - a.t) / 1000);
}

/** An instance's tokens/s and draft acceptance between the last two samples, from the
 * requests of this node that ended on it. */
function instanceRates(id) {
  const tps = rate('cairn_instance_completion_tokens_total', id);
  const d = rate('cairn_instance_draft_tokens_total', id), acc = rate('cairn_instance_accepted_draft_tokens_total', id);
  return `${fmtNum(tps)}` + (d > 0 ? ` · drafts accepted ${fmtNum((100 * acc) / d, 0)}%` : '');
}

function renderInstances() {
  const s = ui.state;
  const el = $('instances');
  if (el.contains(document.activeElement) && document.activeElement.matches('input, select')) return; // editing
  const last = ui.samples.at(-1)?.m || {};
  const ids = Object.keys(s.instances).sort();
  const drafted = rate('cairn_draft_tokens_total'), accepted = rate('cairn_accepted_draft_tokens_total');
  fill(el, h('p', { class: 'muted' }, `This node: ${fmtNum(rate('cairn_completion_tokens_total'))} tokens/s, ` +
      `${last.cairn_requests_running ?? '–'} requests running, ${last.cairn_requests_queued ?? '–'} queued` +
      (drafted > 0 ? `, drafts accepted ${fmtNum((100 * accepted) / drafted, 0)}%` : '')),
  ids.length ? null : h('p', { class: 'empty' }, 'No instance. Place a model from its placements on the Models page.'),
  h('div', { class: 'cards wide' }, ids.map((id) => {
    const inst = s.instances[id];
    const st = instanceStatus(inst);
    const kvU = last.cairn_kv_cache_blocks_used?.[id], kvT = last.cairn_kv_cache_blocks_total?.[id];
    const draftSel = h('select', { class: 'draft-model' }, h('option', { value: '' }, 'none'),
      draftsFor(inst.model_id).concat(inst.draft_model && !draftsFor(inst.model_id).includes(inst.draft_model) ? [inst.draft_model] : [])
        .map((x) => h('option', { value: x, selected: inst.draft_model === x }, x)));
    const nIn = h('input', { type: 'number', min: 0, max: 16, value: inst.num_draft_tokens, class: 'num-draft', size: 3 });
    return h('article', { class: 'card', 'data-instance': id },
      h('header', null, h('strong', null, inst.model_id), h('code', { class: 'nid', title: id }, shortId(id)),
        h('span', { class: `pill st-${st}` }, st), h('span', { class: 'muted' }, `${inst.sharding} · epoch ${inst.epoch}`),
        h('span', { class: 'spacer' }),
        h('button', { class: 'ghost', title: 'chat with this model', onclick: () => {
          chat.settings.model = inst.model_id;
          location.hash = '#chat';
        } }, 'Chat'),
        h('button', { class: 'ghost danger', onclick: () => deleteInstance(id) }, 'Delete')),
      h('table', { class: 'grid' }, h('thead', null, h('tr', null, ['rank', 'node', 'layers', 'runner', 'restarts', 'epoch'].map((x) => h('th', null, x)))),
        h('tbody', null, inst.shards.map((sh) => {
          const r = s.runners[sh.runner_id];
          return h('tr', null, h('td', null, `${sh.rank}/${sh.world_size}`), h('td', null, nodeName(sh.node_id)),
            h('td', null, `${sh.layer_begin}–${sh.layer_end}`),
            h('td', { class: 'runner-status' }, h('span', { class: `dot ${r?.status || 'none'}` }), r?.status || 'none',
              r?.error ? h('div', { class: 'err' }, r.error) : null),
            h('td', { class: 'num' }, r?.restart_count ?? '–'), h('td', { class: 'num' }, r?.epoch ?? '–'));
        }))),
      h('dl', { class: 'kv' },
        h('dt', null, 'tokens/s'), h('dd', { class: 'inst-tps' }, instanceRates(id)),
        h('dt', null, 'sequences'), h('dd', null, `${last.cairn_runner_busy_slots?.[id] ?? '–'} running of ${last.cairn_runner_slots?.[id] ?? '–'} slots · ${last.cairn_runner_queue_length?.[id] ?? '–'} queued`),
        h('dt', null, 'KV cache'), h('dd', null, kvT ? `${kvU} of ${kvT} blocks (${Math.round((100 * kvU) / kvT)}%)` : '–'),
        h('dt', null, 'context'), h('dd', { class: 'inst-ctx' }, `${inst.ctx_len ?? 'default'} positions · K ${inst.cache_type_k ?? 'f16'}, V ${inst.cache_type_v ?? 'f16'}`),
        h('dt', null, 'draft'), h('dd', { class: 'draft-now' }, inst.draft_model ? `${inst.draft_model} · ${inst.num_draft_tokens} tokens` : 'none')),
      h('div', { class: 'row' }, h('label', null, 'draft model ', draftSel), h('label', null, 'tokens ', nIn),
        h('button', { class: 'apply-draft', onclick: () => setDraft(id, draftSel.value, Number(nIn.value)) }, 'Apply')));
  })));
}

// ---- metrics ----

async function sampleMetrics() {
  if (document.hidden) return;
  try {
    const text = await (await raw('/metrics')).text();
    ui.samples.push({ t: Date.now(), m: parseMetrics(text) });
    const cut = Date.now() - 10 * 60_000;
    while (ui.samples.length && ui.samples[0].t < cut) ui.samples.shift();
    if (ui.tab === 'metrics' || ui.tab === 'instances') render();
  } catch { /* the status pill says when the node is gone */ }
}

function chart(title, series, unit) {
  const W = 320, H = 90;
  const all = series.flatMap((s) => s.points.map((p) => p[1])).filter(Number.isFinite);
  const max = Math.max(1e-9, ...all);
  const t1 = Date.now(), t0 = Math.max(t1 - 5 * 60_000, (ui.samples[0]?.t ?? t1) - 1000); // fills while young
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', preserveAspectRatio: 'none' });
  g.append(svg('line', { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'axis' }));
  series.forEach((s, k) => {
    const pts = s.points.filter((p) => p[0] >= t0 && Number.isFinite(p[1]))
      .map(([t, v]) => `${(((t - t0) / (t1 - t0)) * W).toFixed(1)},${(H - 4 - (v / max) * (H - 10)).toFixed(1)}`);
    if (pts.length) g.append(svg('polyline', { points: pts.join(' '), class: `ser s${k % 4}` }));
  });
  const lastV = series.map((s) => s.points.at(-1)?.[1]).filter(Number.isFinite);
  return h('div', { class: 'panel chart-box' },
    h('div', { class: 'row' }, h('strong', null, title), h('span', { class: 'spacer' }),
      h('span', { class: 'muted' }, `now ${lastV.length ? fmtNum(lastV[0]) : '–'} ${unit} · max ${fmtNum(max)}`)),
    g, series.length > 1 ? h('div', { class: 'legend' }, series.map((s, k) => h('span', { class: `s${k % 4}` }, '■ ', s.name))) : null);
}

function deriv(name) {
  const out = [];
  for (let i = 1; i < ui.samples.length; i++) {
    const a = ui.samples[i - 1], b = ui.samples[i];
    const va = typeof a.m[name] === 'object' ? Object.values(a.m[name]).reduce((x, y) => x + y, 0) : a.m[name];
    const vb = typeof b.m[name] === 'object' ? Object.values(b.m[name]).reduce((x, y) => x + y, 0) : b.m[name];
    out.push([b.t, Math.max(0, (vb - va) / ((b.t - a.t) / 1000))]);
  }
  return out;
}

function renderMetrics() {
  if (ui.tab !== 'metrics') return;
  const ids = new Set();
  for (const s of ui.samples) for (const id of Object.keys(s.m.cairn_runner_queue_length || {})) ids.add(id);
  const per = (name, f = (x) => x) => [...ids].map((id) => ({ name: `${ui.state.instances[id]?.model_id || '?'} ${shortId(id)}`,
    points: ui.samples.map((s) => [s.t, f(s.m[name]?.[id], s, id)]) }));
  fill($('metrics'),
    h('p', { class: 'muted' }, 'The last 5 minutes of this node, sampled from /metrics every 2 s while the page is open.'),
    h('div', { class: 'charts' },
      chart('tokens/s', [{ name: 'generated', points: deriv('cairn_completion_tokens_total') },
        { name: 'prompt', points: deriv('cairn_prompt_tokens_total') }], 'tok/s'),
      chart('tokens/s per instance', [...ids].map((id) => ({ name: `${ui.state.instances[id]?.model_id || '?'} ${shortId(id)}`,
        points: ui.samples.slice(1).map((s, i) => [s.t, Math.max(0, ((s.m.cairn_instance_completion_tokens_total?.[id] ?? NaN) -
          (ui.samples[i].m.cairn_instance_completion_tokens_total?.[id] ?? NaN)) / ((s.t - ui.samples[i].t) / 1000))]) })), 'tok/s'),
      chart('requests/s', [{ name: 'all outcomes', points: deriv('cairn_requests_total') }], 'req/s'),
      chart('running sequences', per('cairn_runner_busy_slots'), ''),
      chart('queue', per('cairn_runner_queue_length'), ''),
      chart('KV cache use', per('cairn_kv_cache_blocks_used', (v, s, id) => {
        const t = s.m.cairn_kv_cache_blocks_total?.[id];
        return t ? (100 * v) / t : NaN;
      }), '%')));
}

// ---- chat ----

const CHATS = 'cairn.chats';
const chat = {
  list: [], cur: null, ctl: null, busy: false,
  settings: JSON.parse(localStorage.getItem('cairn.chatSettings') || 'null') ||
    { model: '', system: '', temperature: 0.7, top_p: 0.95, max_tokens: 1024 },
};
function loadChats() {
  try {
    chat.list = JSON.parse(localStorage.getItem(CHATS) || '[]').filter((c) => c && Array.isArray(c.messages));
  } catch { chat.list = []; }
  chat.cur = chat.list[0] || newChat(false);
}
function saveChats() {
  try {
    localStorage.setItem(CHATS, JSON.stringify(chat.list.slice(0, 50)));
    localStorage.setItem('cairn.chatSettings', JSON.stringify(chat.settings));
  } catch (e) { toast(`could not keep the conversation: ${e.message}`); }
}
function newChat(render = true) {
  const c = { id: crypto.randomUUID(), title: 'New chat', messages: [], at: Date.now() };
  chat.list.unshift(c);
  chat.cur = c;
  if (render) buildChat();
  return c;
}

function chatModels() {
  const ids = new Set(Object.values(ui.state?.instances || {}).map((i) => i.model_id));
  for (const m of ui.models) ids.add(m.id);
  return [...ids].sort();
}

function renderChatModels() {
  const sel = $('chat-model');
  if (!sel || !ui.state || document.activeElement === sel) return;
  const ids = chatModels();
  const ready = new Set(Object.values(ui.state.instances).filter((i) => ['Ready', 'Running'].includes(instanceStatus(i))).map((i) => i.model_id));
  if (!ids.includes(chat.settings.model) && ids.length) chat.settings.model = [...ready][0] || ids[0];
  fill(sel, ids.map((id) => h('option', { value: id, selected: id === chat.settings.model }, id + (ready.has(id) ? '' : ' (not placed)'))));
}

function figures(m) {
  const f = m.figures;
  if (!f) return null;
  const parts = [];
  if (Number.isFinite(f.ttft)) parts.push(`first token ${(f.ttft / 1000).toFixed(2)} s`);
  if (f.tokens) parts.push(`${f.tokens} tokens`);
  if (Number.isFinite(f.tps)) parts.push(`${f.tps.toFixed(1)} tok/s`);
  if (f.drafted) parts.push(`drafted ${f.drafted}, accepted ${f.accepted} (${Math.round((100 * f.accepted) / f.drafted)}%)`);
  if (f.live) parts.push('streaming…');
  if (f.stopped) parts.push('stopped');
  if (f.finish && f.finish !== 'stop') parts.push(`finish: ${f.finish}`);
  return h('div', { class: 'figures' }, parts.join(' · '));
}

function messageEl(m) {
  if (m.role === 'user') return h('div', { class: 'msg user' }, h('div', { class: 'content' }, m.content));
  const el = h('div', { class: 'msg assistant' });
  if (m.reasoning) el.append(h('details', { class: 'reasoning' }, h('summary', null, 'reasoning'), h('div', { class: 'md' }, markdown(m.reasoning))));
  el.append(h('div', { class: 'content md' }, markdown(m.content || '')));
  for (const t of m.tool_calls || [])
    el.append(h('div', { class: 'tool' }, h('span', { class: 'muted' }, 'tool call '), h('strong', null, t.name || '?'),
      h('pre', null, t.arguments || '')));
  if (m.error) el.append(h('div', { class: 'err' }, m.error));
  const f = figures(m);
  if (f) el.append(f);
  return el;
}

function renderMessages() {
  const box = $('chat-log');
  if (!box) return;
  const atEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  fill(box, chat.cur.messages.length ? chat.cur.messages.map(messageEl)
    : h('p', { class: 'empty' }, 'Ask something. Enter sends, Shift+Enter starts a new line.'));
  if (atEnd) box.scrollTop = box.scrollHeight;
}

function buildChat() {
  const st = chat.settings;
  const input = h('textarea', { id: 'chat-input', rows: 3, placeholder: 'Message (Enter sends, Shift+Enter new line)',
    onkeydown: (e) => {
      if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      } else if (e.key === 'Escape' && chat.busy) stop();
    } });
  const num = (key, attrs) => h('input', { type: 'number', ...attrs, value: st[key], id: `chat-${key}`,
    onchange: (e) => { st[key] = e.target.value === '' ? null : Number(e.target.value); saveChats(); } });
  fill($('chat'), h('div', { class: 'chat' },
    h('aside', { class: 'chats' },
      h('button', { class: 'primary', onclick: () => newChat() }, '+ New chat'),
      h('ul', null, chat.list.map((c) => h('li', { class: c === chat.cur ? 'on' : '' },
        h('a', { href: '#chat', onclick: (e) => { e.preventDefault(); chat.cur = c; buildChat(); } }, c.title),
        h('button', { class: 'x', title: 'delete this conversation', onclick: () => {
          chat.list = chat.list.filter((x) => x !== c);
          chat.cur = chat.list[0] || newChat(false);
          saveChats();
          buildChat();
        } }, '×'))))),
    h('div', { class: 'chat-main' },
      h('div', { class: 'row wrap settings' },
        h('label', null, 'model ', h('select', { id: 'chat-model', onchange: (e) => { st.model = e.target.value; saveChats(); } })),
        h('label', null, 'temperature ', num('temperature', { min: 0, max: 2, step: 0.1 })),
        h('label', null, 'top p ', num('top_p', { min: 0, max: 1, step: 0.05 })),
        h('label', null, 'max tokens ', num('max_tokens', { min: 1, max: 65536, step: 1 })),
        h('details', { class: 'sys' }, h('summary', null, 'system prompt'),
          h('textarea', { id: 'chat-system', rows: 3, value: st.system, placeholder: 'You are a helpful assistant.',
            oninput: (e) => { st.system = e.target.value; saveChats(); } }))),
      h('div', { id: 'chat-log', class: 'log', 'aria-live': 'polite' }),
      h('div', { class: 'composer' }, input,
        h('div', { class: 'col' },
          h('button', { id: 'send', class: 'primary', onclick: send, hidden: chat.busy }, 'Send'),
          h('button', { id: 'stop', class: 'danger', onclick: stop, hidden: !chat.busy }, 'Stop'))))));
  renderChatModels();
  renderMessages();
}

function stop() {
  chat.ctl?.abort();
}

async function send() {
  const input = $('chat-input');
  const text = input.value.trim();
  if (!text || chat.busy) return;
  const st = chat.settings;
  if (!st.model) return toast('no model to chat with: pull and place one first');
  const c = chat.cur;
  c.messages.push({ role: 'user', content: text });
  if (c.title === 'New chat') c.title = text.slice(0, 40);
  input.value = '';
  const msgs = [];
  if (st.system?.trim()) msgs.push({ role: 'system', content: st.system });
  for (const m of c.messages) msgs.push({ role: m.role, content: m.content || '' });
  const a = { role: 'assistant', content: '', reasoning: '', tool_calls: [], model: st.model, figures: {} };
  c.messages.push(a);
  chat.busy = true;
  chat.ctl = new AbortController();
  buildChat();
  const t0 = performance.now();
  let first = 0, chunks = 0, usage = null, finish = null;
  let scheduled = false;
  const paint = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      if (chat.cur === c) renderMessages();
    });
  };
  try {
    const body = { model: st.model, messages: msgs, stream: true, stream_options: { include_usage: true } };
    for (const k of ['temperature', 'top_p', 'max_tokens']) if (Number.isFinite(st[k])) body[k] = st[k];
    const r = await raw('/v1/chat/completions', { method: 'POST', body, signal: chat.ctl.signal });
    await readSSE(r.body, (data) => {
      if (data === '[DONE]') return;
      const j = JSON.parse(data);
      if (j.error) throw new Error(j.error.message || String(j.error));
      if (j.usage) usage = j.usage;
      const ch = j.choices?.[0];
      if (!ch) return;
      const d = ch.delta || {};
      if (d.content || d.reasoning_content) {
        if (!first) first = performance.now();
        chunks++;
      }
      if (d.content) a.content += d.content;
      if (d.reasoning_content) a.reasoning += d.reasoning_content;
      for (const t of d.tool_calls || []) {
        const slot = a.tool_calls[t.index ?? a.tool_calls.length] ??= { name: '', arguments: '' };
        if (t.function?.name) slot.name += t.function.name;
        if (t.function?.arguments) slot.arguments += t.function.arguments;
      }
      if (ch.finish_reason) finish = ch.finish_reason;
      if (first) { // the figures so far, from the pieces that came
        const now = performance.now();
        Object.assign(a.figures, { live: true, ttft: first - t0, tokens: chunks,
          tps: chunks > 1 && now > first ? ((chunks - 1) * 1000) / (now - first) : NaN });
      }
      paint();
    });
  } catch (e) {
    if (e.name === 'AbortError') a.figures.stopped = true;
    else a.error = e.message;
  } finally {
    const t1 = performance.now();
    const tokens = usage?.completion_tokens ?? chunks;
    Object.assign(a.figures, { live: false, ttft: first ? first - t0 : NaN, tokens,
      tps: first && t1 > first && tokens > 1 ? ((tokens - 1) * 1000) / (t1 - first) : NaN,
      drafted: usage?.draft_tokens || 0, accepted: usage?.accepted_draft_tokens || 0, finish });
    if (!a.tool_calls.length) delete a.tool_calls;
    chat.busy = false;
    chat.ctl = null;
    saveChats();
    if (chat.cur === c) {
      buildChat();
      $('chat-input')?.focus();
    }
  }
}

// ---- start ----

async function start() {
  initTheme();
  setAuthHandler(askKey);
  loadChats();
  window.addEventListener('hashchange', () => showTab(location.hash.slice(1)));
  document.addEventListener('keydown', (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || e.target.closest('input, textarea, select, dialog')) return;
    const tabs = ['cluster', 'models', 'instances', 'chat', 'metrics'];
    if (e.key >= '1' && e.key <= '5') location.hash = `#${tabs[Number(e.key) - 1]}`;
    else if (e.key === '/' && ui.tab === 'models') {
      e.preventDefault();
      $('model-search')?.focus();
    }
  });
  try {
    ui.self = (await call('/node_id')).node_id;
  } catch (e) {
    toast(`node: ${e.message}`);
  }
  let modelsTimer = null;
  liveState((state, e) => {
    ui.state = state;
    // the models on disk are not in the state: read them again when a download ends
    if (e?.kind === 'NodeDownloadProgress' && e.status !== 'Ongoing' && !modelsTimer)
      modelsTimer = setTimeout(() => { modelsTimer = null; loadModels(); }, 300);
    render();
  }, (status) => {
    const pill = $('live');
    pill.textContent = status;
    pill.className = `pill ${status === 'live' ? 'ok' : 'warn'}`;
  });
  buildChat();
  await loadModels();
  showTab(location.hash.slice(1) || 'cluster');
  sampleMetrics();
  setInterval(sampleMetrics, 2000);
}

start();
