// Shared by the Node integration tests: free ports, starting a kvserve process and waiting for
// its ready line, making the random-weight test model.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';

export function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Spawns `cmd` (recorded in `children` for cleanup) and resolves once its stdout or stderr
// matches `readyPattern`; rejects if it exits first or takes over a minute.
export function startAndWait(children, cmd, args, readyPattern) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let out = '';
    const timer = setTimeout(() => reject(new Error(`${cmd} not ready: ${out}`)), 60000);
    const onData = (d) => {
      out += d;
      if (readyPattern.test(out)) {
        clearTimeout(timer);
        resolve(child);
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', (code) => reject(new Error(`${cmd} exited ${code}: ${out}`)));
  });
}

// The random-weight Llama around the real Llama 3 tokenizer, written to `dir`.
export function makeModel(bin, tokenizerDir, dir) {
  const made = spawnSync(path.join(bin, 'kvserve-make-model'), ['--tokenizer', tokenizerDir, '--out', dir]);
  assert.equal(made.status, 0, String(made.stderr));
}
