// Fault tests on a local cluster (kvserve-cluster: router + 2 CPU workers, supervised): a
// worker killed with SIGKILL mid-stream ends its stream with an error event (no hang), the
// request queued behind it on that worker (not started) completes on the other worker, new
// requests keep succeeding; the supervisor restarts the worker and the router resyncs its
// index from the new instance (its old cache is dropped, a snapshot applied). A client that
// disconnects, mid-stream or waiting for a whole answer, aborts its request on the worker. A
// model path full of shell syntax starts a cluster as it is. A second cluster whose worker ports
// are taken fails at once, saying why, with a non-zero exit.
//
//   node cluster_fault_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { freeRange, makeModel, retryOnPortClash, startCluster } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-fault-'));
const model = path.join(tmp, 'tiny');
const token = 'fault-test-admin';
let cluster;
let base;
let workerBase;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function admin() {
  const r = await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${token}` } });
  assert.equal(r.status, 200);
  return (await r.json()).workers;
}

async function waitFor(what, fn, ms = 60000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

// The pid of the kvserve-worker listening on `port` (from /proc, no pgrep needed).
function workerPid(port) {
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let cmd;
    try { cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0'); } catch { continue; }
    if (!cmd[0] || !cmd[0].endsWith('kvserve-worker')) continue;
    const i = cmd.indexOf('--port');
    if (i >= 0 && cmd[i + 1] === String(port)) return Number(pid);
  }
  return null;
}

// Reads an SSE completion stream to its end; resolves with the events' data strings.
async function readStream(response, onFirst) {
  const events = [];
  const decoder = new TextDecoder();
  let pending = '';
  for await (const chunk of response.body) {
    pending += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = pending.indexOf('\n\n')) >= 0) {
      const event = pending.slice(0, end);
      pending = pending.slice(end + 2);
      if (event.startsWith('data: ')) {
        events.push(event.slice(6));
        if (events.length === 1 && onFirst) onFirst();
      }
    }
  }
  return events;
}

function completion(body, signal) {
  return fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, signal,
    body: JSON.stringify({ model: 'tiny', ...body }),
  });
}

before(async () => {
  makeModel(bin, tokenizerDir, model);
  let http;
  cluster = await retryOnPortClash(async () => {
    http = await freeRange(1);
    workerBase = await freeRange(6);
    return startCluster(bin, ['--model', model, '--workers', '2', '--port', String(http),
      '--base-port', String(workerBase), '--policy', 'session', '--max-model-len', '4096',
      // Two requests per worker from the router, one running at the worker: a second request
      // queues at the worker itself (the router's admission would otherwise hold it back).
      '--router-args', `--admin-token ${token} --heartbeat-timeout-seconds 1 --max-inflight-per-worker 2`,
      '--', '--max-num-seqs', '1', '--num-blocks', '1024']);
  });
  base = `http://127.0.0.1:${http}`;
});

after(async () => {
  if (cluster) {
    cluster.kill('SIGTERM');
    await new Promise((r) => cluster.once('exit', r));
  }
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('SIGKILL mid-stream: the stream ends with an error, queued work moves, the worker comes back resynced', async () => {
  const user = 'victim';
  // The long stream starts on the session's worker...
  const controller = new AbortController();
  const streamed = completion({ prompt: 'Tell me everything', max_tokens: 3000, ignore_eos: true, stream: true, user },
    controller.signal);
  const response = await streamed;
  assert.equal(response.status, 200);
  let started;
  const firstToken = new Promise((r) => { started = r; });
  const events = readStream(response, started);
  await firstToken;
  const busy = await waitFor('the busy worker', async () => (await admin()).find((w) => w.num_running === 1));
  const [, port] = busy.name.split(':');
  // ...and a second request of the same session queues behind it (one sequence per worker).
  const queued = completion({ prompt: 'A short one', max_tokens: 5, user });
  await waitFor('the queued request', async () => (await admin()).find((w) => w.name === busy.name && w.num_waiting === 1), 10000);

  const pid = workerPid(port);
  assert.ok(pid, `no worker process on port ${port}`);
  process.kill(pid, 'SIGKILL');

  const t0 = Date.now();
  const got = await events;  // must end, not hang
  assert.ok(Date.now() - t0 < 15000, 'the stream took too long to end');
  const last = got.filter((e) => e !== '[DONE]').map((e) => JSON.parse(e)).pop();
  assert.ok(last.error, `the stream should end with an error event, got ${JSON.stringify(last)}`);
  const moved = await queued;
  assert.equal(moved.status, 200);
  const body = await moved.json();
  assert.equal(body.usage.completion_tokens, 5);
  // New requests succeed while the worker is down.
  const during = await completion({ prompt: 'Still there?', max_tokens: 3, user });
  assert.equal(during.status, 200);

  // The supervisor restarts it: a new instance, eligible again, its old cache forgotten by the
  // router's index and a snapshot applied.
  const back = await waitFor('the restarted worker', async () =>
    (await admin()).find((w) => w.name === busy.name && w.eligible && w.instance_id !== busy.instance_id && w.router.kv_snapshots > busy.router.kv_snapshots));
  assert.equal(back.router.index_blocks, 0);
  // It caches again: the same long prompt twice (same session, same worker) hits the second time.
  const prompt = 'word '.repeat(100);
  const first = await (await completion({ prompt, max_tokens: 2, user })).json();
  const second = await (await completion({ prompt, max_tokens: 2, user })).json();
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(second.usage.prompt_tokens_details.cached_tokens > 0);
  // The router's index learns the new instance's blocks (the admin view refreshes every 50 ms).
  await waitFor('the resynced index', async () =>
    (await admin()).find((w) => w.name === busy.name && w.router.index_blocks > 0), 10000);
});

test('a client that disconnects aborts its request on the worker', async () => {
  const controller = new AbortController();
  const response = await completion({ prompt: 'Go on and on', max_tokens: 3000, ignore_eos: true, stream: true, user: 'leaver' },
    controller.signal);
  assert.equal(response.status, 200);
  const reader = response.body.getReader();
  await reader.read();  // the first bytes arrived: it is running
  const running = await waitFor('the running request', async () => (await admin()).find((w) => w.num_running === 1), 10000);
  controller.abort();
  // 3000 tokens would take many seconds; the abort frees the worker almost at once.
  await waitFor('the abort', async () => (await admin()).find((w) => w.name === running.name && w.num_running === 0), 5000);
});

// Issue 26: a non-streaming client that went away was not noticed (nothing is written to it
// until the end), so the worker generated all of it anyway.
test('a non-streaming client that disconnects aborts its request on the worker', async () => {
  const controller = new AbortController();
  const pending = completion({ prompt: 'Go on and on', max_tokens: 3000, ignore_eos: true, user: 'quiet-leaver' },
    controller.signal).catch((e) => e);
  const running = await waitFor('the running request', async () => (await admin()).find((w) => w.num_running === 1), 10000);
  controller.abort();
  assert.equal((await pending).name, 'AbortError');
  await waitFor('the abort', async () => (await admin()).find((w) => w.name === running.name && w.num_running === 0), 5000);
});

// Issue 25: kvserve-cluster built shell commands with single-quoted paths; a path with a quote
// broke out of them. It now starts its processes with an argument vector.
test('a model path with quotes, spaces and $(...) is passed as it is, never to a shell', async () => {
  const odd = path.join(tmp, 'it\'s a "model" $(touch pwned) `touch pwned2`');
  fs.symlinkSync(model, odd);
  const second = await retryOnPortClash(async () => startCluster(bin, ['--model', odd, '--workers', '1',
    '--port', String(await freeRange(1)), '--base-port', String(await freeRange(3))]));
  second.kill('SIGTERM');
  await new Promise((r) => second.once('exit', r));
  for (const f of ['pwned', 'pwned2']) assert.ok(!fs.existsSync(f) && !fs.existsSync(path.join(tmp, f)), `${f} was made`);
});

test('a cluster whose worker ports are taken exits at once with the worker\'s reason', async () => {
  const second = spawn(path.join(bin, 'kvserve-cluster'), ['--model', model, '--workers', '1',
    '--port', String(await freeRange(1)), '--base-port', String(workerBase)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  second.stderr.on('data', (d) => { err += d; });
  // The worker exits on its bind error; the cluster must not wait out its 120-second start-up limit.
  const code = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => { second.kill('SIGKILL'); reject(new Error(`still running: ${err}`)); }, 30000);
    second.on('exit', (c) => { clearTimeout(timer); resolve(c); });
  });
  assert.equal(code, 1, err);
  assert.match(err, /worker 0 did not start: .*cannot bind .*Address already in use/);
});
