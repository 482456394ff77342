// A fake Hugging Face hub for tests: the HTTP surface cairn's hub client uses, answered
// as the real hub answers it (shapes checked against huggingface_hub's client):
//   GET /api/models?search=TEXT&filter=gguf&sort=downloads&limit=N   [{"id", "downloads",
//       "likes", "gated"}], and one malformed entry a client must skip
//   GET /api/models/OWNER/REPO/revision/REV    {"id", "sha", "gated", "private", "siblings"}
//   GET /api/models/OWNER/REPO/tree/REV?recursive=true
//       [{"type":"file","oid","size","path","lfs":{"oid","size","pointerSize"}}], pages of
//       `pageSize` entries chained by `Link: <url>; rel="next"`
//   GET|HEAD /OWNER/REPO/resolve/REV/PATH       302 to STORAGE/storage/COMMIT-SHA256 (another
//       port: another origin, as the hub's CDN is another host) with X-Repo-Commit,
//       X-Linked-Etag ("sha256") and X-Linked-Size
//   GET /storage/COMMIT-SHA256                   the bytes; one Range (206), 416 beyond
// Errors as the hub gives them: 401 + X-Error-Code GatedRepo for a gated repo without a
// valid token, 404 + X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound, and
// 429 + Retry-After for the first `busy` storage requests. Options per repo: files
// ({path, bytes, listedSize: a size the listing claims instead}), gated (the token it
// accepts), corrupt (a path whose storage bytes are not the listed ones). Hub-wide:
// throttle (bytes per second per storage response).
// Counters: storageBytes (body bytes sent), requests (by kind), status429, and the
// Authorization headers seen by the hub's routes (authSeen) and by the storage (storageAuth).
import http from 'node:http';
import crypto from 'node:crypto';

export async function startFakeHub({ repos = {}, throttle = 0, busy = 0, pageSize = 1000 } = {}) {
  const hub = { storageBytes: 0, requests: { revision: 0, tree: 0, resolve: 0, storage: 0 }, status429: 0,
    authSeen: [], storageAuth: [], throttle, busy };
  const blobs = new Map(); // sha256 -> bytes served
  const commits = new Map();
  for (const [name, repo] of Object.entries(repos)) {
    repo.commit = crypto.createHash('sha1').update(name).digest('hex');
    commits.set(name, repo.commit);
    for (const f of repo.files) {
      f.sha256 = crypto.createHash('sha256').update(f.bytes).digest('hex');
      let served = f.bytes;
      if (repo.corrupt === f.path) {
        served = Buffer.from(f.bytes);
        served[served.length >> 1] ^= 0xff;
      }
      f.key = `${repo.commit}-${f.sha256}`; // per repo: two repos may hold the same bytes
      blobs.set(f.key, served);
    }
  }
  const send = (res, status, body, headers = {}) => {
    const text = typeof body === 'string' ? body : JSON.stringify(body);
    res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text),
      ...headers });
    res.end(text);
  };
  const repoOf = (owner, name, req, res) => {
    const repo = repos[`${owner}/${name}`];
    if (!repo) {
      send(res, 404, { error: 'Repository not found' }, { 'x-error-code': 'RepoNotFound' });
      return null;
    }
    const auth = req.headers.authorization || '';
    hub.authSeen.push(auth);
    if (repo.gated && auth !== `Bearer ${repo.gated}`) {
      send(res, 401, { error: 'Access to this model is restricted' }, { 'x-error-code': 'GatedRepo' });
      return null;
    }
    return repo;
  };
  const revOk = (repo, rev) => rev === 'main' || rev === repo.commit;

  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://x');
    const parts = url.pathname.split('/').map(decodeURIComponent);
    try {
      if (parts[1] === 'api' && parts[2] === 'models' && parts.length === 3) { // search
        const q = (url.searchParams.get('search') ?? '').toLowerCase();
        const gguf = url.searchParams.get('filter') === 'gguf';
        const limit = Number(url.searchParams.get('limit') ?? 1000);
        const found = Object.entries(repos)
          .filter(([name, r]) => name.toLowerCase().includes(q) && (!gguf || r.files.some((f) => f.path.endsWith('.gguf'))))
          .map(([name, r]) => ({ id: name, downloads: r.downloads ?? 0, likes: r.likes ?? 0,
            gated: r.gated ? 'manual' : false, tags: ['gguf'] }))
          .sort((x, y) => y.downloads - x.downloads).slice(0, limit);
        return send(res, 200, [...found, { id: 'not a repo name', downloads: 1 }]);
      }
      if (parts[1] === 'api' && parts[2] === 'models' && parts[5] === 'revision') {
        hub.requests.revision++;
        const repo = repoOf(parts[3], parts[4], req, res);
        if (!repo)
          return;
        if (!revOk(repo, parts.slice(6).join('/')))
          return send(res, 404, { error: 'Revision not found' }, { 'x-error-code': 'RevisionNotFound' });
        return send(res, 200, { id: `${parts[3]}/${parts[4]}`, sha: repo.commit, gated: repo.gated ? 'manual' : false,
          private: false, siblings: repo.files.map((f) => ({ rfilename: f.path })) });
      }
      if (parts[1] === 'api' && parts[2] === 'models' && parts[5] === 'tree') {
        hub.requests.tree++;
        const repo = repoOf(parts[3], parts[4], req, res);
        if (!repo)
          return;
        if (!revOk(repo, parts[6]))
          return send(res, 404, { error: 'Revision not found' }, { 'x-error-code': 'RevisionNotFound' });
        const all = [{ type: 'directory', oid: 'd'.repeat(40), size: 0, path: 'docs' },
          ...repo.files.map((f) => ({ type: 'file', oid: crypto.createHash('sha1').update(f.path).digest('hex'),
            size: f.listedSize ?? f.bytes.length, path: f.path,
            lfs: { oid: f.listedSha256 ?? f.sha256, size: f.listedSize ?? f.bytes.length, pointerSize: 134 } }))];
        const start = Number(url.searchParams.get('cursor') ?? 0);
        const page = all.slice(start, start + pageSize);
        const headers = {};
        if (start + pageSize < all.length)
          headers.link = `<http://127.0.0.1:${hub.port}${url.pathname}?recursive=true&cursor=${start + pageSize}>; rel="next"`;
        return send(res, 200, page, headers);
      }
      const ri = parts.indexOf('resolve');
      if (ri === 3) {
        hub.requests.resolve++;
        const repo = repoOf(parts[1], parts[2], req, res);
        if (!repo)
          return;
        if (!revOk(repo, parts[4]))
          return send(res, 404, { error: 'Revision not found' }, { 'x-error-code': 'RevisionNotFound' });
        const path = parts.slice(5).join('/');
        const f = repo.files.find((x) => x.path === path);
        if (!f)
          return send(res, 404, { error: 'Entry not found' }, { 'x-error-code': 'EntryNotFound' });
        res.writeHead(302, { location: `${hub.storageUrl}/storage/${f.key}?expires=1`, 'x-repo-commit': repo.commit,
          'x-linked-etag': `"${f.sha256}"`, 'x-linked-size': String(f.bytes.length), 'content-length': 0 });
        return res.end();
      }
      if (parts[1] === 'storage') {
        hub.requests.storage++;
        hub.storageAuth.push(req.headers.authorization ?? '');
        if (hub.busy > 0) {
          hub.busy--;
          hub.status429++;
          return send(res, 429, { error: 'Too many requests' }, { 'retry-after': '1' });
        }
        const bytes = blobs.get(parts[2]);
        if (!bytes)
          return send(res, 404, 'no such object');
        let first = 0, last = bytes.length - 1, status = 200;
        const range = req.headers.range;
        if (range) {
          const m = /^bytes=(\d+)-(\d*)$/.exec(range);
          if (!m || Number(m[1]) >= bytes.length) {
            res.writeHead(416, { 'content-range': `bytes */${bytes.length}`, 'content-length': 0 });
            return res.end();
          }
          first = Number(m[1]);
          if (m[2])
            last = Math.min(Number(m[2]), last);
          status = 206;
        }
        const headers = { 'content-type': 'application/octet-stream', 'content-length': last - first + 1,
          'accept-ranges': 'bytes' };
        if (status === 206)
          headers['content-range'] = `bytes ${first}-${last}/${bytes.length}`;
        res.writeHead(status, headers);
        if (req.method === 'HEAD')
          return res.end();
        const chunk = hub.throttle ? Math.max(1024, Math.floor(hub.throttle / 20)) : 1 << 20;
        for (let at = first; at <= last && !res.destroyed; at += chunk) {
          const piece = bytes.subarray(at, Math.min(at + chunk, last + 1));
          hub.storageBytes += piece.length;
          if (!res.write(piece))
            await new Promise((resolve) => res.once('drain', resolve));
          if (hub.throttle)
            await new Promise((resolve) => setTimeout(resolve, 1000 * piece.length / hub.throttle));
        }
        return res.end();
      }
      send(res, 404, { error: 'not found' });
    } catch (e) {
      if (!res.headersSent)
        send(res, 500, { error: String(e) });
      else
        res.destroy();
    }
  });
  // the storage host is another origin (port), as the real hub's CDN is another host
  const storage = http.createServer(server.listeners('request')[0]);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  await new Promise((resolve) => storage.listen(0, '127.0.0.1', resolve));
  hub.port = server.address().port;
  hub.url = `http://127.0.0.1:${hub.port}`;
  hub.storageUrl = `http://127.0.0.1:${storage.address().port}`;
  const closeOne = (srv) => new Promise((resolve) => {
    srv.closeAllConnections?.();
    srv.close(resolve);
  });
  hub.close = () => Promise.all([closeOne(server), closeOne(storage)]);
  return hub;
}
