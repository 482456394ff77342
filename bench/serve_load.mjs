// Load generator for bench/serve.sh: streams OpenAI /v1/completions requests at a server
// (cairn node or llama-server) on 127.0.0.1 and times each SSE chunk as it arrives.
// Plain node (>= 18), no packages. Every mode prints one JSON object on stdout.
//
//   node bench/serve_load.mjs prompt    --tokens N [--salt K]     the prompt text of N tokens
//   node bench/serve_load.mjs streams   --url U --model M --n N [--prompt-tokens 128] [--gen 128]
//   node bench/serve_load.mjs sustain   --url U --model M [--n 8] [--prompt-tokens 128] [--gen 128] [--rounds 3]
//   node bench/serve_load.mjs spec      --url U --model M [--prompt-tokens 64] [--gen 64] [--reps 3] [--vocab 128256]
//   node bench/serve_load.mjs ttft      --url U --model M [--prompt-tokens 128] [--reps 5]
//   node bench/serve_load.mjs interfere --url U --model M [--streams 4] [--long-tokens 2000]
//   node bench/serve_load.mjs steps     FILE                        how the runner's steps filled (CAIRN_STEP_LOG)
//   node bench/serve_load.mjs table     FILE.jsonl                  the Markdown summary
//
// Prompts: BOS plus words that are one token each under the llama-bpe vocabulary, so a
// prompt of N tokens is N - 1 words; serve.sh checks the count with `cairn tokenize`,
// and every reply's usage.prompt_tokens is checked against it. The first two words come
// from a request counter (--salt offsets it), so no two prompts share a cached prefix
// beyond BOS. Requests ask for temperature 0 and ignore_eos, so each generates exactly
// max_tokens tokens; the count reported is usage.completion_tokens.
import http from 'node:http';
import fs from 'node:fs';
import { performance } from 'node:perf_hooks';

// The engine's B = 8 rates just before and after a run further apart than this ratio are
// flagged in the table: on a shared machine a neighbour's work can move them 4x in minutes.
const SPREAD_WARN = 1.15;
const WORDS = (
  'the of and to in is that for it as was with be by on not he this are or his from at ' +
  'which but have an they you were her she there been one all we their has would when if ' +
  'so no will can more other into some could them than then its time only new first any ' +
  'these may after most also made over did many before must through back years where much ' +
  'your way well down should because each just those people how too little state good very ' +
  'make world still own see men work long get here between both life being under never day ' +
  'same another know while last might us great old year off come since against go came right'
).split(' ');

function die(msg) {
  process.stderr.write(`serve_load: ${msg}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const o = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) { o._.push(a); continue; }
    if (i + 1 >= argv.length) die(`${a} needs a value`);
    o[a.slice(2)] = argv[++i];
  }
  return o;
}

function intArg(o, name, def, lo, hi) {
  if (o[name] === undefined) return def;
  const v = Number(o[name]);
  if (!Number.isInteger(v) || v < lo || v > hi) die(`--${name} ${o[name]}: expected an integer in ${lo}..${hi}`);
  return v;
}

// The text of a prompt of `tokens` tokens (BOS included); `k` picks its first two words.
function promptText(tokens, k) {
  const n = WORDS.length, words = [];
  words.push(WORDS[k % n], WORDS[Math.floor(k / n) % n]);
  for (let i = 2; i < tokens - 1; i++) words.push(WORDS[(i * 7 + 3) % n]);
  return words.slice(0, tokens - 1).join(' ');
}

let counter = 0, salt = 0, deadline = Infinity;

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}
const sortNum = (a) => [...a].sort((x, y) => x - y);
const median = (a) => {
  const s = sortNum(a), n = s.length;
  return n === 0 ? NaN : n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
};
const round = (x, d = 2) => (Number.isFinite(x) ? Number(x.toFixed(d)) : null);

// One streamed completion. Resolves with times (ms, performance.now()) of sending, of
// every chunk that carries a choice, the end, and the usage the server reported.
// onChunk(req) runs after each chunk; req.abort() ends it early (outcome 'aborted').
function streamCompletion(cfg, tokens, maxTokens, onChunk, extra = {}) {
  const prompt = promptText(tokens, salt + counter++);
  const body = JSON.stringify({
    model: cfg.model, prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true }, ...extra,
  });
  const u = new URL('/v1/completions', cfg.url);
  return new Promise((resolve) => {
    const r = {
      sent: performance.now(), chunks: [], usage: null, status: 0, error: null, outcome: 'ok',
      promptTokens: tokens, abort: null, done: false,
    };
    let buf = '';
    const finish = (outcome, error) => {
      if (r.done) return;
      r.done = true;
      r.end = performance.now();
      if (outcome) r.outcome = outcome;
      if (error) r.error = error;
      clearTimeout(timer);
      resolve(r);
    };
    const req = http.request({
      host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    });
    const timer = setTimeout(() => { req.destroy(); finish('timeout', 'timed out'); },
                             Math.max(1, deadline - performance.now()));
    r.abort = () => { req.destroy(); finish('aborted'); };
    req.on('error', (e) => finish('error', e.message));
    req.on('response', (res) => {
      r.status = res.statusCode;
      res.setEncoding('utf8');
      if (res.statusCode !== 200) {
        let t = '';
        res.on('data', (d) => { t += d; });
        res.on('end', () => finish('error', `HTTP ${res.statusCode}: ${t.slice(0, 300)}`));
        return;
      }
      res.on('data', (d) => {
        const now = performance.now();
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          for (const line of ev.split('\n')) {
            if (!line.startsWith('data:')) continue;
            const data = line.slice(5).trim();
            if (data === '[DONE]') continue;
            let j;
            try { j = JSON.parse(data); } catch { continue; }
            if (j.usage) r.usage = j.usage;
            if (j.timings) r.timings = j.timings;
            if (Array.isArray(j.choices) && j.choices.length) {
              r.chunks.push(now);
              if (onChunk && !r.done) onChunk(r);
            }
          }
        }
      });
      res.on('end', () => finish());
      res.on('error', (e) => finish('error', e.message));
    });
    req.end(body);
  });
}

function generated(r) {
  return r.usage && Number.isInteger(r.usage.completion_tokens) ? r.usage.completion_tokens : r.chunks.length;
}

// Problems worth a line in the table: failures and prompts that did not count as asked.
function checkReplies(rs, wantGen) {
  const notes = [];
  for (const r of rs) {
    if (r.outcome !== 'ok' && r.outcome !== 'aborted') notes.push(`${r.outcome}: ${r.error}`);
    if (r.usage && r.usage.prompt_tokens !== undefined && r.usage.prompt_tokens !== r.promptTokens)
      notes.push(`prompt counted ${r.usage.prompt_tokens} tokens, not ${r.promptTokens}`);
    if (wantGen && r.outcome === 'ok' && generated(r) !== wantGen)
      notes.push(`generated ${generated(r)} tokens, not ${wantGen}`);
  }
  return [...new Set(notes)];
}

function cached(rs) {
  let m = 0;
  for (const r of rs) {
    const c = r.usage && r.usage.prompt_tokens_details ? r.usage.prompt_tokens_details.cached_tokens : 0;
    if (c > m) m = c;
  }
  return m;
}

// N streams at once. decode_tps: the rate while all N decode, from the last stream's
// first token to the first stream's last one: the chunks of every stream in that window
// (each stream's chunks weighted by its tokens per chunk) over its length; null when the
// window holds fewer than 2 chunks a stream. e2e_tps: every generated token over the wall
// time from the first send to the last end.
async function modeStreams(o, cfg) {
  const n = intArg(o, 'n', 1, 1, 256), pt = intArg(o, 'prompt-tokens', 128, 2, 8192);
  const gen = intArg(o, 'gen', 128, 2, 8192);
  const t0 = performance.now();
  const rs = await Promise.all(Array.from({ length: n }, () => streamCompletion(cfg, pt, gen)));
  const t1 = performance.now();
  let total = 0, inWindow = 0;
  const ttft = [];
  const ok = rs.every((r) => r.chunks.length >= 2);
  const w0 = ok ? Math.max(...rs.map((r) => r.chunks[0])) : 0;
  const w1 = ok ? Math.min(...rs.map((r) => r.chunks[r.chunks.length - 1])) : 0;
  let enough = ok && w1 > w0;
  for (const r of rs) {
    const g = generated(r);
    total += g;
    if (r.chunks.length) ttft.push(r.chunks[0] - r.sent);
    if (!enough) continue;
    const k = r.chunks.filter((t) => t > w0 && t <= w1).length;
    if (k < 2) enough = false;
    inWindow += (k * g) / r.chunks.length;
  }
  const decode = enough ? inWindow / ((w1 - w0) / 1e3) : NaN;
  return {
    mode: 'streams', n, prompt_tokens: pt, gen, tokens: total, decode_tps: round(decode),
    window_s: round((w1 - w0) / 1e3), wall_s: round((t1 - t0) / 1e3, 3),
    e2e_tps: round(total / ((t1 - t0) / 1e3)), ttft_ms_median: round(median(ttft), 1),
    ttft_ms_max: round(Math.max(...ttft), 1), cached_max: cached(rs), notes: checkReplies(rs, gen),
  };
}

// N clients, each sending requests back to back (no pause between one's end and the next
// one's send) for --rounds requests, so that prompts keep arriving while the others
// decode; client i's first request generates (i + 1) / N of --gen, which spreads the
// arrivals out. The window runs from the first request's end (from then on requests
// arrive) to the first client's last end (until then all N have a request in flight).
// Counted in it: generated tokens (every chunk that arrived in it, weighted by its
// request's tokens per chunk) and the prompt tokens of the requests sent in it;
// gen_tps is the generated tokens over the window: the prefill of the arriving prompts
// is in the window's time, not in the count.
async function modeSustain(o, cfg) {
  const n = intArg(o, 'n', 8, 1, 256), pt = intArg(o, 'prompt-tokens', 128, 2, 8192);
  const gen = intArg(o, 'gen', 128, 2, 8192), rounds = intArg(o, 'rounds', 3, 2, 1000);
  const rs = [], lastEnd = [];
  const client = async (i) => {
    for (let k = 0; k < rounds; k++) {
      const g = k === 0 ? Math.max(2, Math.round((gen * (i + 1)) / n)) : gen;
      const r = await streamCompletion(cfg, pt, g);
      r.gen = g;
      rs.push(r);
      if (r.outcome !== 'ok') break;
    }
    lastEnd[i] = performance.now();
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: n }, (_, i) => client(i)));
  const t1 = performance.now();
  const w0 = Math.min(...rs.map((r) => r.end)), w1 = Math.min(...lastEnd);
  let genIn = 0, promptIn = 0, sent = 0;
  for (const r of rs) {
    if (r.sent >= w0 && r.sent < w1) {
      promptIn += r.promptTokens;
      sent++;
    }
    if (!r.chunks.length) continue;
    const k = r.chunks.filter((t) => t > w0 && t <= w1).length;
    genIn += (k * generated(r)) / r.chunks.length;
  }
  const win = (w1 - w0) / 1e3;
  return {
    mode: 'sustain', n, prompt_tokens: pt, gen, rounds, requests: rs.length, window_s: round(win),
    window_gen_tokens: round(genIn, 1), window_prompt_tokens: promptIn, window_requests_sent: sent,
    gen_tps: round(w1 > w0 ? genIn / win : NaN),
    e2e_tps: round(rs.reduce((a, r) => a + generated(r), 0) / ((t1 - t0) / 1e3)),
    notes: checkReplies(rs, 0).concat(w1 > w0 && sent > 0 ? [] : ['no request arrived while the others ran: more --rounds']),
  };
}

// The prompt of `cairn bench --draft -p N`: the same N pseudo-random ids (its generator,
// over a vocabulary of --vocab ids), so that a draft is accepted as often as there.
function benchPromptIds(n, vocab) {
  const ids = [], mask = (1n << 64n) - 1n;
  let x = 12345n;
  for (let i = 0; i < n; i++) {
    x = (x * 6364136223846793005n + 1442695040888963407n) & mask;
    ids.push(Number(3n + (x >> 33n) % BigInt(vocab - 3)));
  }
  return ids;
}

// Speculative decoding through the API: one stream at a time, requests without drafts
// (num_draft_tokens 0) and with the instance's draft in turn, --reps of each, the
// prompt of `cairn bench --draft` (--prompt-tokens ids). Each request's decode rate is
// its tokens after the first over the time from its first chunk to its last; the
// speed-up is each drafted request's rate over the plain one's before it, and their
// median. Verify steps of a drafted request: its tokens after the first less the
// accepted drafts (each step gives its accepted drafts and one token of the target).
async function modeSpec(o, cfg) {
  const pt = intArg(o, 'prompt-tokens', 64, 2, 8192), gen = intArg(o, 'gen', 64, 2, 8192);
  const reps = intArg(o, 'reps', 3, 1, 100), vocab = intArg(o, 'vocab', 128256, 4, 1 << 24);
  const ids = benchPromptIds(pt, vocab);
  const one = async (k) => {
    const r = await streamCompletion(cfg, pt, gen, null, { prompt: ids, num_draft_tokens: k });
    const n = generated(r), c = r.chunks;
    const u = r.usage || {};
    return { outcome: r.outcome, error: r.error, n, promptTokens: pt, usage: r.usage,
             tps: c.length >= 2 ? (n - 1) / ((c[c.length - 1] - c[0]) / 1e3) : NaN,
             drafted: u.draft_tokens || 0, accepted: u.accepted_draft_tokens || 0 };
  };
  const plain = [], spec = [];
  for (let i = 0; i < reps; i++) {
    plain.push(await one(0));
    spec.push(await one(-1));
  }
  const ratios = spec.map((r, i) => r.tps / plain[i].tps);
  const steps = spec.map((r) => r.n - 1 - r.accepted);
  return {
    mode: 'spec', prompt_tokens: pt, gen, reps, plain_tps: plain.map((r) => round(r.tps)), spec_tps: spec.map((r) => round(r.tps)),
    speedups: ratios.map((x) => round(x, 3)), speedup_median: round(median(ratios), 3),
    drafted: spec.map((r) => r.drafted), accepted: spec.map((r) => r.accepted),
    tokens_per_step: round(median(spec.map((r, i) => (r.n - 1) / steps[i])), 3),
    notes: checkReplies([...plain, ...spec], gen).concat(spec.some((r) => r.drafted === 0) ? ['a request drafted nothing'] : []),
  };
}

// TTFT of one streamed request at a time (max_tokens 1): send to first chunk. Where the
// server reports its own prefill time of the request (llama-server: timings.prompt_ms),
// overhead_ms is TTFT less that time, the same request's cost outside the engine.
async function modeTtft(o, cfg) {
  const pt = intArg(o, 'prompt-tokens', 128, 2, 8192), reps = intArg(o, 'reps', 5, 1, 100);
  const t = [], rs = [], over = [];
  for (let i = 0; i < reps; i++) {
    const r = await streamCompletion(cfg, pt, 1);
    rs.push(r);
    if (!r.chunks.length) continue;
    t.push(r.chunks[0] - r.sent);
    if (r.timings && Number.isFinite(r.timings.prompt_ms)) over.push(r.chunks[0] - r.sent - r.timings.prompt_ms);
  }
  const s = sortNum(t);
  return {
    mode: 'ttft', prompt_tokens: pt, reps, ttft_ms_min: round(s[0], 2), ttft_ms_median: round(median(s), 2),
    overhead_ms: over.length ? round(median(over), 2) : null,
    cached_max: cached(rs), notes: checkReplies(rs, 1),
  };
}

// `streams` streams decode; once each has `warm` chunks a long prompt arrives. The
// streams stop `after` chunks past the long prompt's first token. Gaps between chunks
// of the streams: median over every gap; p99 over every gap; and the gaps that overlap
// the long prompt's prefill (from its send to its first chunk): p99 and max.
async function modeInterfere(o, cfg) {
  const ns = intArg(o, 'streams', 4, 1, 64), pt = intArg(o, 'prompt-tokens', 128, 2, 8192);
  const lt = intArg(o, 'long-tokens', 2000, 2, 16384), warm = intArg(o, 'warm', 24, 2, 1000);
  const after = intArg(o, 'after', 24, 1, 1000), maxGen = intArg(o, 'max-gen', 1024, 8, 16384);
  let long = null, longFirst = null, stopAt = Infinity;
  const streams = [];
  const launchLong = () => {
    long = streamCompletion(cfg, lt, 4, (lr) => {
      if (longFirst === null) {
        longFirst = lr.chunks[0];
        stopAt = Math.max(...streams.map((s) => s.r ? s.r.chunks.length : 0)) + after;
      }
    });
  };
  const ps = [];
  for (let i = 0; i < ns; i++) {
    const s = { r: null };
    streams.push(s);
    ps.push(streamCompletion(cfg, pt, maxGen, (r) => {
      s.r = r;
      if (long === null && streams.every((x) => x.r && x.r.chunks.length >= warm)) launchLong();
      if (r.chunks.length >= stopAt) r.abort();
    }));
  }
  const rs = await Promise.all(ps);
  if (long === null) die('the streams ended before every one reached --warm chunks');
  const lr = await long;
  const longSent = lr.sent, longEnd = lr.chunks.length ? lr.chunks[0] : lr.end;
  const all = [], during = [];
  for (const r of rs) {
    for (let i = 1; i < r.chunks.length; i++) {
      const a = r.chunks[i - 1], b = r.chunks[i];
      all.push(b - a);
      if (b > longSent && a < longEnd) during.push(b - a);
    }
  }
  const sa = sortNum(all), sd = sortNum(during), med = median(sa);
  return {
    mode: 'interfere', streams: ns, long_tokens: lt, itl_ms_median: round(med), itl_ms_p99: round(pct(sa, 99)),
    during_n: sd.length, during_ms_p99: round(pct(sd, 99)), during_ms_max: round(sd[sd.length - 1]),
    p99_ratio: round(pct(sd, 99) / med), long_ttft_ms: round(lr.chunks.length ? lr.chunks[0] - lr.sent : NaN, 1),
    cached_max: cached([...rs, lr]),
    notes: checkReplies([...rs, lr], 0).concat(lr.chunks.length ? [] : ['the long prompt gave no token']),
  };
}

// ---------- the Markdown summary of serve.sh's results ----------

// How the runner's steps filled (its CAIRN_STEP_LOG file, see src/runner/runner.c): the
// steps by sequences decoding in them, those that carried prompt tokens, the full steps
// (the most sequences decoding, no prompt) and their median ms, the ms from the first
// task's arrival to the first full step (the batch filling) and the steps after the
// last full one (the tail, streams that started late finishing alone).
// For the serving account (accountOf), the runner's time in phases: `before` (first
// task to first step), `gaps` (between steps: reading and starting tasks, relaying
// tokens), and the steps in three classes, fill (before the first full step), full and
// tail (after the last full one), each with its ms, prompt tokens and the number of its
// steps by sequences decoding (decoding[B]); span_ms from the first task to the last
// step's end.
function modeSteps(o) {
  const file = o._[1];
  if (!file) die('steps FILE');
  const steps = [], tasks = [];
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    const f = line.split(' ');
    if (f[0] === 'task' && f.length === 2) tasks.push(Number(f[1]));
    else if (f[0] === 'step' && (f.length === 5 || f.length === 6)) // older runners: no forward field
      steps.push({ t0: Number(f[1]), t1: Number(f[2]), dec: Number(f[3]), prompt: Number(f[4]),
                   fwd: f.length === 6 ? Number(f[5]) : NaN });
  }
  if (!steps.length) return { mode: 'steps', steps: 0 };
  const top = Math.max(...steps.map((x) => x.dec));
  const byDecoding = {};
  for (const x of steps) byDecoding[x.dec] = (byDecoding[x.dec] || 0) + 1;
  const full = steps.map((x, i) => ({ x, i })).filter(({ x }) => x.dec === top && x.prompt === 0);
  const ms = full.map(({ x }) => (x.t1 - x.t0) / 1e6);
  // a full step less its forward: the scheduler's own work (sampling, reporting, building)
  const own = full.map(({ x }) => (x.t1 - x.t0 - x.fwd) / 1e6).filter(Number.isFinite);
  const mean = (a) => (a.length ? a.reduce((u, v) => u + v, 0) / a.length : NaN);
  const first = full.length ? full[0].x.t0 : NaN;
  const iFirst = full.length ? full[0].i : steps.length, iLast = full.length ? full[full.length - 1].i : steps.length - 1;
  const cls = {};
  for (const k of ['fill', 'full', 'tail']) cls[k] = { steps: 0, ms: 0, prompt: 0, decoding: {} };
  steps.forEach((x, i) => {
    const c = cls[i < iFirst ? 'fill' : i <= iLast ? 'full' : 'tail'];
    c.steps++;
    c.ms += (x.t1 - x.t0) / 1e6;
    c.prompt += x.prompt;
    if (x.dec > 0) c.decoding[x.dec] = (c.decoding[x.dec] || 0) + 1;
  });
  for (const k in cls) cls[k].ms = round(cls[k].ms, 1);
  let gaps = 0;
  for (let i = 1; i < steps.length; i++) gaps += (steps[i].t0 - steps[i - 1].t1) / 1e6;
  const t0 = tasks.length ? Math.min(...tasks) : steps[0].t0;
  return {
    mode: 'steps', steps: steps.length, tasks: tasks.length, by_decoding: byDecoding,
    with_prompt: steps.filter((x) => x.prompt > 0).length, most_decoding: top, full_steps: full.length,
    full_step_ms_median: round(median(ms), 2),
    full_step_ms_mean: round(mean(ms), 2),
    full_own_ms_median: own.length ? round(median(own), 3) : null,
    full_own_ms_mean: own.length ? round(mean(own), 3) : null,
    fill_ms: tasks.length && full.length ? round((first - Math.min(...tasks)) / 1e6, 1) : null,
    tail_steps: full.length ? steps.length - 1 - full[full.length - 1].i : null,
    before_ms: round((steps[0].t0 - t0) / 1e6, 1), gaps_ms: round(gaps, 1),
    span_ms: round((steps[steps.length - 1].t1 - t0) / 1e6, 1), classes: cls,
  };
}

// The serving account of one 8-stream run: what the engine alone needs for the run's
// work against the wall time the clients saw. The engine's time for a class of steps:
// its prompt tokens at the engine's prefill rate (pp tok/s) plus, for each step in
// which B sequences decoded, the engine's step of B sequences at the streams' average
// depth (curve[B - 1] ms, `cairn bench --batch-curve 8 --batch-depth 192`): the same
// prompt tokens and the same decode steps, each counted at the engine's own cost. A step
// with prompt tokens beside B decoding sequences is priced as the two apart, though one
// forward reads the weights once for both: that over-prices the engine's side of such
// steps (the fill), by at most one decode step each.
// The rest of the wall is outside the runner's steps: the HTTP requests, the node and
// the runner before the first step (`before`, from the first task's arrival), the
// gaps between steps, and the clients' time before the first task reached the runner
// and after its last step (`outside`: wall less span). The ideal schedule: the same
// prompt tokens at pp and every decoded token in steps of 8 (no filling, no tail);
// ideal_efficiency is its time over the wall.
function accountOf(streams, steps, curve, pp) {
  if (!streams || !steps || !steps.classes || !Array.isArray(curve) || !(pp > 0) || !(streams.wall_s > 0)) return null;
  const cost = (c) => {
    let ms = (c.prompt / pp) * 1e3;
    for (const [b, n] of Object.entries(c.decoding)) {
      const k = Math.min(Number(b), curve.length) - 1;
      if (!(curve[k] > 0)) return NaN;
      ms += n * curve[k] * (Number(b) / (k + 1)); // beyond the curve: its last point per sequence
    }
    return ms;
  };
  const wall = streams.wall_s * 1e3, parts = {};
  let engine = 0, prompt = 0, decoded = 0;
  for (const k of ['fill', 'full', 'tail']) {
    const c = steps.classes[k], e = cost(c);
    engine += e;
    prompt += c.prompt;
    for (const [b, n] of Object.entries(c.decoding)) decoded += Number(b) * n;
    parts[k] = { steps: c.steps, served_ms: c.ms, engine_ms: round(e, 1) };
  }
  const b = Math.min(8, curve.length), ideal = (prompt / pp) * 1e3 + (decoded * curve[b - 1]) / b;
  if (!Number.isFinite(engine) || !Number.isFinite(ideal)) return null;
  return {
    wall_ms: round(wall, 1), engine_ms: round(engine, 1), efficiency: round(engine / wall, 3),
    ideal_ms: round(ideal, 1), ideal_efficiency: round(ideal / wall, 3),
    outside_ms: round(wall - steps.span_ms, 1), before_ms: steps.before_ms, gaps_ms: steps.gaps_ms, parts,
  };
}

function modeTable(o) {
  const file = o._[1];
  if (!file) die('table needs the results file');
  const rows = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  const servers = [...new Set(rows.map((r) => r.server))];
  const get = (server, f) => rows.filter((r) => r.server === server && f(r));
  const best = (xs, key, max = true) =>
    xs.filter((x) => Number.isFinite(x[key])).sort((a, b) => (max ? b[key] - a[key] : a[key] - b[key]))[0];
  const out = [];
  const meta = rows.find((r) => r.mode === 'meta');
  const loads = rows.filter((r) => r.mode === 'load').map((r) => r.loadavg);
  if (meta) out.push(`${meta.model}, ${meta.threads} threads, ${meta.reps} runs of each measure (best shown)` +
                     (loads.length ? `; 1-minute load average ${Math.min(...loads)} to ${Math.max(...loads)} ` +
                      `on ${meta.cpus} CPUs as the runs began` : '') +
                     (meta.ref_wait ? `; llama.cpp's OMP_WAIT_POLICY: ${meta.ref_wait}` : '') +
                     (meta.cairn ? `; served by ${meta.cairn}` : '') + '\n');
  out.push('Aggregate decode tokens/s (each stream: 128-token prompt, 128 generated; ratio to 1 stream; end-to-end tok/s in brackets)\n');
  const levels = [...new Set(rows.filter((r) => r.mode === 'streams').map((r) => r.n))].sort((a, b) => a - b);
  out.push(`| server | ${levels.map((n) => `${n} stream${n > 1 ? 's' : ''}`).join(' | ')} |`);
  out.push(`|---|${levels.map(() => '---:').join('|')}|`);
  for (const s of servers) {
    const base = best(get(s, (r) => r.mode === 'streams' && r.n === 1), 'decode_tps');
    const cells = levels.map((n) => {
      const b = best(get(s, (r) => r.mode === 'streams' && r.n === n), 'decode_tps');
      if (!b) return '-';
      const ratio = base ? ` x${(b.decode_tps / base.decode_tps).toFixed(2)}` : '';
      return `${b.decode_tps.toFixed(1)}${ratio} (${b.e2e_tps.toFixed(1)})`;
    });
    if (cells.some((c) => c !== '-')) out.push(`| ${s} | ${cells.join(' | ')} |`);
  }
  const cpu = rows.filter((r) => r.mode === 'cpu');
  if (cpu.length) {
    const ns = [...new Set(cpu.map((r) => r.n))].sort((a, b) => a - b);
    out.push(`\nCores the cairn runner used while N streams ran, each run (of ${meta ? meta.threads : '?'} threads; ` +
             'fewer: the machine was busy or the runner waited); the node process in brackets: ' +
             ns.map((n) => `${n}: ${cpu.filter((r) => r.n === n).map((r) => `${r.runner_cores} (${r.node_cores})`).join(', ')}`)
               .join('; '));
  }
  const stp = rows.filter((r) => r.mode === 'steps' && r.steps > 0);
  if (stp.length)
    out.push('\nThe runner\'s steps while 8 streams ran, each run (CAIRN_STEP_LOG): ' +
             stp.map((r) => `${r.steps} steps, ${r.full_steps} with all ${r.most_decoding} decoding (median ` +
                            `${r.full_step_ms_median} ms, mean ${r.full_step_ms_mean} ms` +
                            (r.full_own_ms_median !== null && r.full_own_ms_median !== undefined
                              ? `, of which outside the forward (sampling, reporting, building the batch) median ` +
                                `${r.full_own_ms_median} ms, mean ${r.full_own_ms_mean} ms` : '') +
                            `), ${r.with_prompt} carrying prompt tokens; the batch full ` +
                            `${r.fill_ms} ms after the first request arrived, ${r.tail_steps} steps after the last full one`)
               .join('; '));
  // Serving against the engine: each of cairn's 8-stream and back-to-back runs against
  // the mean of the engine's runs just before and after it (serve.sh's engine8).
  const keep = [];
  rows.forEach((r, i) => {
    if (r.server !== 'cairn' || !((r.mode === 'streams' && r.n === 8) || r.mode === 'sustain')) return;
    const before = rows.slice(0, i).reverse().find((x) => x.mode === 'engine8');
    const after = rows.slice(i + 1).find((x) => x.mode === 'engine8');
    const es = [before, after].filter(Boolean);
    if (!es.length) return;
    const b8 = es.reduce((a, e) => a + e.b8_tps, 0) / es.length;
    const pp = es.reduce((a, e) => a + e.pp128_tps, 0) / es.length;
    const d = es.filter((e) => Number.isFinite(e.b8_d192_tps));
    const b8d = d.length ? d.reduce((a, e) => a + e.b8_d192_tps, 0) / d.length : NaN;
    const cs = es.filter((e) => Array.isArray(e.d192_curve_ms) && e.d192_curve_ms.length);
    // a hole (null) in either run's curve stays a hole (NaN), not a zero in the mean
    const curve = cs.length ? cs[0].d192_curve_ms.map((_, k) => cs.reduce((a, e) => a + (e.d192_curve_ms[k] > 0 ? e.d192_curve_ms[k] : NaN), 0) / cs.length) : null;
    const steps = r.mode === 'streams' ? rows.slice(i + 1).find((x) => x.mode === 'steps') : null;
    // the engine's B = 8 rates before and after: where they differ much, the machine's load
    // moved between them and the mean is no yardstick for the run between
    const spread = es.length === 2 ? Math.max(before.b8_tps, after.b8_tps) / Math.min(before.b8_tps, after.b8_tps) : 1;
    keep.push({ r, b8, pp, b8d, es, spread, steps, acc: accountOf(r, steps, curve, pp) });
  });
  if (keep.length) {
    out.push('');
    out.push('Serving against the engine alone (`cairn bench -p 128 -n 0 -r 3 --batch-curve 8` just before and after ' +
             'each run, their mean), each run:\n');
    out.push('- the engine\'s B = 8 before / after each run (tok/s, at depth 0; at depth 192): ' +
             keep.filter((k) => k.r.mode === 'streams').map((k) => k.es.map((e) => `${e.b8_tps.toFixed(1)}` +
                                            (Number.isFinite(e.b8_d192_tps) ? ` (${e.b8_d192_tps.toFixed(1)})` : '') +
                                            ` at load ${e.loadavg}`).join(' / ') +
                             (k.spread > SPREAD_WARN ? ` (**x${k.spread.toFixed(2)} apart: the load moved, the ratios ` +
                                                      'against their mean below say little**)' : ''))
               .join('; '));
    const st = keep.filter((k) => k.r.mode === 'streams');
    if (st.length)
      out.push('- 8 streams through the API (the window where all 8 decode, no prefill in it) / the engine\'s step of ' +
               'B = 8: ' + st.map((k) => `${k.r.decode_tps.toFixed(1)} / ${k.b8.toFixed(1)} tok/s = ` +
                                      `**${(k.r.decode_tps / k.b8).toFixed(2)}**` +
                                      (Number.isFinite(k.b8d) ? ` (against the engine's B = 8 after 192 positions ` +
                                       `of context each, as the streams are on average: ${k.b8d.toFixed(1)} tok/s, ` +
                                       `${(k.r.decode_tps / k.b8d).toFixed(2)})` : '')).join('; '));
    // the full steps' median alone against each engine run apart: one step against one
    // step, so a run whose before and after differ still says which it was near
    const fs8 = st.filter((k) => k.steps && k.steps.full_step_ms_median > 0 && k.steps.most_decoding === 8);
    if (fs8.length)
      out.push('- a served full step of 8 (the step log\'s median) against the engine\'s step of 8 at depth 192 before / ' +
               'after the run, the engine\'s ms / the served ms: ' +
               fs8.map((k) => `${k.steps.full_step_ms_median.toFixed(2)} ms against ` +
                              k.es.map((e) => {
                                const ms = Array.isArray(e.d192_curve_ms) ? e.d192_curve_ms[7] : null;
                                return ms > 0 ? `${ms.toFixed(2)} (**${(ms / k.steps.full_step_ms_median).toFixed(2)}**)` : '?';
                              }).join(' / ')).join('; '));
    const ac = st.filter((k) => k.acc);
    if (ac.length)
      out.push('- 8 streams end to end (first send to last end: the prompts\' prefill, the batch filling, the tail), ' +
               'the serving account: the engine\'s own time for the same work (the steps\' prompt tokens at its ' +
               'pp128 rate plus, for every step of B decoding sequences, its step of B at depth 192) / the wall ' +
               'time = **serving efficiency**; the ideal schedule\'s time (the same prompt tokens at pp128 and every ' +
               'decoded token in steps of B = 8 at depth 192) / the wall time; the plain end-to-end tok/s / the engine\'s B = 8 rate ' +
               '(depth 0, and depth 192); then where the wall went, served ms / the engine\'s ms for the same ' +
               'steps: ' +
               ac.map((k) => {
                 const a = k.acc, p = a.parts;
                 return `${(a.engine_ms / 1e3).toFixed(2)} / ${(a.wall_ms / 1e3).toFixed(2)} s = ` +
                        `**${a.efficiency.toFixed(2)}**; ideal ${(a.ideal_ms / 1e3).toFixed(2)} s, ` +
                        `**${a.ideal_efficiency.toFixed(2)}**; ${k.r.e2e_tps.toFixed(1)} tok/s / ${k.b8.toFixed(1)} = ` +
                        `${(k.r.e2e_tps / k.b8).toFixed(2)} (/ ${k.b8d.toFixed(1)} = ${(k.r.e2e_tps / k.b8d).toFixed(2)}); ` +
                        `outside the runner's steps ${a.outside_ms.toFixed(0)} ms (HTTP and node before the first ` +
                        `task and after the last step), first task to first step ${a.before_ms.toFixed(0)} ms, ` +
                        `between steps ${a.gaps_ms.toFixed(0)} ms, ` +
                        ['fill', 'full', 'tail'].map((c) => `${c} ${p[c].steps} steps ${p[c].served_ms.toFixed(0)} / ` +
                                                           `${p[c].engine_ms.toFixed(0)} ms`).join(', ');
               }).join('; '));
    const su = keep.filter((k) => k.r.mode === 'sustain' && Number.isFinite(k.r.gen_tps));
    if (su.length) {
      const s0 = su[0].r;
      out.push(`- 8 clients sending requests back to back (${s0.prompt_tokens}-token prompts arriving while the others ` +
               `decode, ${s0.gen} tokens each, ${s0.rounds} rounds; the window from the first request\'s end to the ` +
               'first client\'s last end), generated tok/s / the engine\'s B = 8 rate (the arriving prompts\' ' +
               'prefill counted as time, not tokens): ' +
               su.map((k) => `${k.r.gen_tps.toFixed(1)} / ${k.b8.toFixed(1)} = ${(k.r.gen_tps / k.b8).toFixed(2)}`).join('; '));
      out.push('- the same runs, the engine\'s own time for the window\'s work (its prompts at the engine\'s pp128 rate ' +
               'plus its generated tokens at the B = 8 rate) / the window: ' +
               su.map((k) => {
                 const t = k.r.window_prompt_tokens / k.pp + k.r.window_gen_tokens / k.b8;
                 return `(${k.r.window_prompt_tokens} / ${k.pp.toFixed(0)} + ${k.r.window_gen_tokens.toFixed(0)} / ` +
                        `${k.b8.toFixed(1)}) / ${k.r.window_s.toFixed(1)} s = **${(t / k.r.window_s).toFixed(2)}**`;
               }).join('; '));
    }
  }
  const eng = rows.filter((r) => r.mode === 'engine');
  if (eng.length) {
    out.push('');
    out.push('Engine alone (`cairn bench`): prefill ms, decode tok/s, and one forward over B sequences (tok/s, ratio to B = 1)\n');
    for (const e of eng) out.push(`- ${e.text}`);
  }
  out.push('');
  out.push('Latency\n');
  out.push('| server | TTFT 128-token prompt (min / median ms) | engine prefill 128 (min ms) | TTFT - prefill (ms) | ' +
           'TTFT - the prefill time the server reports for the same request (median ms) | ' +
           'ITL median / p99 (ms), 4 streams | ITL p99 / max during 2000-token prefill (ms) | p99 ratio | ' +
           '2000-token TTFT beside 4 streams / alone (ms) | ratio |');
  out.push('|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  // ITL columns come from the run with the lowest p99 ratio; the 2000-token TTFTs are
  // the lowest of their runs.
  for (const s of servers) {
    const ts = get(s, (r) => r.mode === 'ttft' && r.prompt_tokens === 128);
    const t = best(ts, 'ttft_ms_min', false);
    const alone = best(get(s, (r) => r.mode === 'ttft' && r.prompt_tokens !== 128), 'ttft_ms_min', false);
    const pf = best(get(s, (r) => r.mode === 'prefill' && r.prompt_tokens === 128), 'ms', false);
    const its = get(s, (r) => r.mode === 'interfere');
    const it = best(its, 'p99_ratio', false), lt = best(its, 'long_ttft_ms', false);
    if (!t && !it) continue;
    const c = [];
    c.push(t ? `${t.ttft_ms_min.toFixed(1)} / ${median(ts.map((r) => r.ttft_ms_median)).toFixed(1)}` : '-');
    c.push(pf ? pf.ms.toFixed(1) : '-');
    c.push(t && pf ? (t.ttft_ms_min - pf.ms).toFixed(1) : '-');
    const ov = ts.map((r) => r.overhead_ms).filter(Number.isFinite);
    c.push(ov.length ? median(ov).toFixed(1) : 'not reported');
    c.push(it ? `${it.itl_ms_median.toFixed(1)} / ${it.itl_ms_p99.toFixed(1)}` : '-');
    c.push(it ? `${it.during_ms_p99.toFixed(1)} / ${it.during_ms_max.toFixed(1)} (${it.during_n} gaps)` : '-');
    c.push(it ? `x${it.p99_ratio.toFixed(2)}` : '-');
    c.push(lt && alone ? `${lt.long_ttft_ms.toFixed(0)} / ${alone.ttft_ms_min.toFixed(0)}` : '-');
    c.push(lt && alone ? `x${(lt.long_ttft_ms / alone.ttft_ms_min).toFixed(2)}` : '-');
    out.push(`| ${s} | ${c.join(' | ')} |`);
  }
  const pf2 = rows.filter((r) => r.mode === 'prefill' && r.prompt_tokens !== 128);
  for (const p of pf2) out.push(`\n${p.server}: engine prefill of ${p.prompt_tokens} tokens alone: ${p.ms.toFixed(0)} ms`);
  const notes = rows.filter((r) => r.notes && r.notes.length);
  if (notes.length) {
    out.push('\nNotes:');
    for (const r of notes) out.push(`- ${r.server} ${r.mode}${r.n ? ` n=${r.n}` : ''}: ${r.notes.join('; ')}`);
  }
  return out.join('\n');
}

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const mode = o._[0];
  if (mode === 'prompt') {
    process.stdout.write(promptText(intArg(o, 'tokens', 128, 2, 16384), intArg(o, 'salt', 0, 0, 1e9)));
    return;
  }
  if (mode === 'steps') {
    const res = modeSteps(o);
    if (o.server) res.server = o.server;
    process.stdout.write(JSON.stringify(res) + '\n');
    return;
  }
  if (mode === 'table') {
    process.stdout.write(modeTable(o) + '\n');
    return;
  }
  const cfg = { url: o.url, model: o.model };
  if (!cfg.url || !cfg.model) die('--url and --model are required');
  salt = intArg(o, 'salt', Math.floor(Math.random() * 1e6), 0, 1e9);
  deadline = performance.now() + intArg(o, 'timeout-s', 300, 1, 3600) * 1e3;
  const modes = { streams: modeStreams, sustain: modeSustain, spec: modeSpec, ttft: modeTtft, interfere: modeInterfere };
  if (!modes[mode]) die(`unknown mode '${mode}' (prompt, streams, sustain, spec, ttft, interfere, steps, table)`);
  const res = await modes[mode](o, cfg);
  if (o.server) res.server = o.server;
  process.stdout.write(JSON.stringify(res) + '\n');
}

main().catch((e) => die(e.stack || String(e)));
