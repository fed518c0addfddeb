// Shared by the Node integration tests: free ports, starting a kvserve process and waiting for
// its ready line, making the random-weight test model.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';

// Ports handed out by this process, never handed out twice.
const handedOut = new Set();

// A loopback port nothing listens on, drawn below the kernel's ephemeral range (32768 and up on
// Linux) so that no test's outgoing connection can take it as its source port between the check
// and the bind. Another process can still take it: the start helpers below retry on a clash.
export async function freePort() {
  for (;;) {
    const port = 10000 + Math.floor(Math.random() * 22000);
    if (!handedOut.has(port) && await portFree(port)) {
      handedOut.add(port);
      return port;
    }
  }
}

function portFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

// Runs `start` (which picks its own free ports) up to three times while it fails because a port
// was taken between the check and the bind.
export async function retryOnPortClash(start) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (e) {
      if (attempt === 3 || !/Address already in use/.test(String(e.message))) throw e;
    }
  }
}

// A base port with `n` consecutive free ports after it.
export async function freeRange(n) {
  for (;;) {
    const start = 10000 + Math.floor(Math.random() * (22000 - n));
    let ok = true;
    for (let p = start; p < start + n && ok; p++) ok = !handedOut.has(p) && await portFree(p);
    if (ok) {
      for (let p = start; p < start + n; p++) handedOut.add(p);
      return start;
    }
  }
}

// Starts kvserve-cluster with `args`; resolves with the process once it says it is ready.
export function startCluster(bin, args) {
  const cluster = spawn(path.join(bin, 'kvserve-cluster'), args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  cluster.stderr.on('data', (d) => { out += d; });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`cluster not ready: ${out}`)), 120000);
    cluster.stdout.on('data', (d) => {
      out += d;
      if (/kvserve-cluster ready/.test(out)) { clearTimeout(timer); resolve(cluster); }
    });
    cluster.on('exit', (code) => reject(new Error(`cluster exited ${code}: ${out}`)));
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
    child.on('exit', (code) => {
      clearTimeout(timer);  // else it keeps node alive for its minute
      reject(new Error(`${cmd} exited ${code}: ${out}`));
    });
  });
}

// The random-weight Llama around the real Llama 3 tokenizer, written to `dir`.
export function makeModel(bin, tokenizerDir, dir) {
  const made = spawnSync(path.join(bin, 'kvserve-make-model'), ['--tokenizer', tokenizerDir, '--out', dir]);
  assert.equal(made.status, 0, String(made.stderr));
}

// A kvserve-router (with `extraArgs`) in front of the worker at `worker` (host:port:events),
// on a free loopback port; resolves with its base URL once it counts the worker as ready.
export function startRouter(bin, model, children, worker, extraArgs = [], maxModelLen = 1024) {
  return retryOnPortClash(() => startRouterOnce(bin, model, children, worker, extraArgs, maxModelLen));
}

async function startRouterOnce(bin, model, children, worker, extraArgs, maxModelLen) {
  const http = await freePort();
  await startAndWait(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1',
    '--port', String(http), '--workers', worker, '--max-model-len', String(maxModelLen), ...extraArgs],
  /kvserve-router ready/);
  const base = `http://127.0.0.1:${http}`;
  for (let i = 0; i < 200; i++) {
    if ((await fetch(`${base}/ready`)).status === 200) break;
    await new Promise((res) => setTimeout(res, 50));
  }
  return base;
}

// A kvserve-worker serving the model at `model` behind a kvserve-router, both on free loopback
// ports (recorded in `children` for cleanup); resolves with the router's base URL, the worker's
// address (for more routers) and its metrics URL once the router counts the worker as ready.
export async function startWorkerAndRouter(bin, model, children, maxModelLen = 1024) {
  const [port, events, metrics] = await retryOnPortClash(async () => {
    const ports = [await freePort(), await freePort(), await freePort()];
    await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1',
      '--port', String(ports[0]), '--events-port', String(ports[1]), '--metrics-port', String(ports[2]),
      '--max-model-len', String(maxModelLen), '--num-blocks', '512'], /kvserve-worker ready/);
    return ports;
  });
  const worker = `127.0.0.1:${port}:${events}`;
  const base = await startRouter(bin, model, children, worker, [], maxModelLen);
  return { base, worker, metrics: `http://127.0.0.1:${metrics}/metrics` };
}
