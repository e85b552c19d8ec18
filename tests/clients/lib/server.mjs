// Starts `steward serve` for a client test and stops it afterwards. The binary comes from
// STEWARD_BIN (ctest passes it), the shared test data from STEWARD_TESTDATA (default ../shared/testdata
// beside the checkout). The server listens on port 0; its address is read from the line it prints.
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const sourceDir = path.resolve(here, '..', '..', '..');
export const testdata = process.env.STEWARD_TESTDATA || path.resolve(sourceDir, '..', 'shared', 'testdata');
export const stewardBin = process.env.STEWARD_BIN || path.resolve(sourceDir, 'build', 'steward');
export const realModel = path.join(testdata, 'real', 'TinyStories-656K.f32.gguf');
export const chatTemplate = (name) => path.join(testdata, 'chat_templates', name);

// A temporary file holding `text` (a TOML config, a template); returns its path.
export function tempFile(name, text) {
  const dir = mkdtempSync(path.join(tmpdir(), 'steward-client-'));
  const p = path.join(dir, name);
  writeFileSync(p, text);
  return p;
}

// Starts `steward serve ARGS... --host 127.0.0.1 --port 0` and waits until it says "ready".
// Returns {url, baseURL (url + '/v1'), stderr(), stop()}.
export async function startServer(args, { timeoutMs = 60000 } = {}) {
  const child = spawn(stewardBin, ['serve', ...args, '--host', '127.0.0.1', '--port', '0'],
                      { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '', err = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => child.on('exit', (code, sig) => resolve({ code, sig })));
  const deadline = Date.now() + timeoutMs;
  let url = null;
  while (Date.now() < deadline) {
    const m = out.match(/listening on (http:\/\/[0-9.]+:\d+)/);
    if (m) url = m[1];
    if (url && err.includes('steward serve: ready')) break;
    if (child.exitCode !== null) throw new Error(`steward serve exited ${child.exitCode}:\n${out}\n${err}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  if (!url || !err.includes('ready')) {
    child.kill('SIGKILL');
    throw new Error(`steward serve was not ready within ${timeoutMs} ms:\n${out}\n${err}`);
  }
  return {
    url,
    baseURL: url + '/v1',
    stderr: () => err,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      const r = await exited;
      if (r.code !== 0) throw new Error(`steward serve exited ${r.code} (${r.sig}) on SIGTERM:\n${err}`);
    },
  };
}
