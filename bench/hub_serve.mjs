// A fake hub (tests/e2e/fakehub.mjs) serving one repo, bench-org/Big-GGUF, whose file
// Big-Q8_0.gguf is SIZE_MIB MiB of random bytes, or the bytes of FILE, for bench/hub.py
// and bench/hub_ranks.py. Prints the hub's URL, then serves until stdin closes; on a
// line "bytes" on stdin it prints the storage bytes sent so far.
// Usage: node bench/hub_serve.mjs SIZE_MIB|FILE [THROTTLE_MIB_S]
import crypto from 'node:crypto';
import fs from 'node:fs';
import readline from 'node:readline';
import { startFakeHub } from '../tests/e2e/fakehub.mjs';

const what = process.argv[2] ?? '1024', throttle = Number(process.argv[3] ?? 0);
const bytes = /^\d+$/.test(what) ? crypto.randomBytes(Number(what) << 20) : fs.readFileSync(what);
const hub = await startFakeHub({ throttle: throttle * (1 << 20),
  repos: { 'bench-org/Big-GGUF': { files: [{ path: 'Big-Q8_0.gguf', bytes }] } } });
console.log(hub.url);
const lines = readline.createInterface({ input: process.stdin });
lines.on('line', (l) => { if (l.trim() === 'bytes') console.log(hub.storageBytes); });
lines.on('close', () => hub.close().then(() => process.exit(0)));
