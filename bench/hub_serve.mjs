// A fake hub (tests/e2e/fakehub.mjs) serving one repo, bench-org/Big-GGUF, whose file
// Big-Q8_0.gguf is SIZE_MIB MiB of random bytes, for bench/hub.py. Prints the hub's URL,
// then serves until stdin closes. Usage: node bench/hub_serve.mjs SIZE_MIB [THROTTLE_MIB_S]
import crypto from 'node:crypto';
import { startFakeHub } from '../tests/e2e/fakehub.mjs';

const mib = Number(process.argv[2] ?? 1024), throttle = Number(process.argv[3] ?? 0);
const bytes = crypto.randomBytes(mib << 20);
const hub = await startFakeHub({ throttle: throttle * (1 << 20),
  repos: { 'bench-org/Big-GGUF': { files: [{ path: 'Big-Q8_0.gguf', bytes }] } } });
console.log(hub.url);
process.stdin.on('end', () => hub.close().then(() => process.exit(0)));
process.stdin.resume();
