// Chaos under steady load (issue 26): three CPU workers (kvserve-cluster, supervised) behind a
// router this test runs itself, clients sending streamed and whole chat completions throughout,
// and one fault at a time: SIGKILL a worker; SIGSTOP a worker past the heartbeat timeout, then
// SIGCONT; SIGSTOP a draining worker; restart the router (SIGTERM: it finishes what it has);
// recycle two workers with --max-unavailable 1. For each, every request ends (none hangs), none
// claims success with tokens missing, and service recovers. The report (a table per fault:
// sent, ok, clean errors, cut, refused, hung, lost, seconds to recover) goes to stdout and, with
// KVSERVE_CHAOS_REPORT=FILE, to FILE as JSON (docs/RELIABILITY.md).
//
//   node chaos_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
//   KVSERVE_CHAOS_SECONDS=30: seconds of load around each fault (default 3, CI)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { freeRange, makeModel, retryOnPortClash, startAndWait, startCluster } from './lib/harness.mjs';
import { OUTCOMES, percentile, startLoad } from './lib/load.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const seconds = Number(process.env.KVSERVE_CHAOS_SECONDS ?? 3);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-chaos-'));
const model = path.join(tmp, 'tiny');
const token = 'chaos-admin';
const children = [];
const report = [];
let cluster;
let router;
let routerPort;
let workers;  // HOST:PORT:EVENTS_PORT names

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const base = () => `http://127.0.0.1:${routerPort}`;

async function admin() {
  const r = await fetch(`${base()}/admin/workers`, { headers: { authorization: `Bearer ${token}` } });
  assert.equal(r.status, 200);
  return (await r.json()).workers;
}

async function control(name, action) {
  const r = await fetch(`${base()}/admin/workers/${name}/${action}`, {
    method: 'POST', headers: { authorization: `Bearer ${token}` },
  });
  assert.equal(r.status, 200, await r.text());
}

async function waitFor(what, fn, ms = 60000) {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch { /* the router may be restarting */ }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

function workerPid(name) {
  const port = name.split(':')[1];
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let cmd;
    try { cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0'); } catch { continue; }
    if (!cmd[0] || !cmd[0].endsWith('kvserve-worker')) continue;
    const i = cmd.indexOf('--port');
    if (i >= 0 && cmd[i + 1] === port) return Number(pid);
  }
  return null;
}

const allEligible = async () => (await admin()).every((w) => w.eligible);

async function startRouter() {
  router = await startAndWait(children, path.join(bin, 'kvserve-router'), [
    '--model', model, '--workers', workers.join(','), '--port', String(routerPort),
    '--served-model-name', 'tiny', '--max-model-len', '2048', '--admin-token', token,
    '--heartbeat-timeout-seconds', '1', '--max-unavailable', '1', '--shutdown-timeout-seconds', '20',
  ], /kvserve-router ready/);
  await waitFor('the router to see every worker', allEligible);
}

// Runs `fault` under load: `seconds` of load before it, then the fault, then load until
// `recovered` holds and `seconds` more. Records the outcomes and the time to recover.
async function underLoad(name, fault, recovered) {
  const load = startLoad(base(), { clients: 4, maxTokens: 24, abandonEvery: 7, hangMs: 60000 });
  await sleep(seconds * 1000);
  const t0 = Date.now();
  await fault();
  await waitFor(`recovery from: ${name}`, recovered, 120000);
  const recover = (Date.now() - t0) / 1000;
  await sleep(seconds * 1000);
  await load.stop();
  const row = { fault: name, sent: load.sent(), ...load.counts, recover_s: recover,
    p99_ok_ms: percentile(load.latencies, 99), notes: load.notes };
  report.push(row);
  return row;
}

function check(row) {
  assert.equal(row.hung, 0, `${row.fault}: requests hung: ${JSON.stringify(row.notes.hung)}`);
  assert.equal(row.lost, 0, `${row.fault}: success with tokens missing: ${JSON.stringify(row.notes.lost)}`);
  assert.ok(row.ok > 0, `${row.fault}: nothing succeeded`);
  const total = OUTCOMES.reduce((sum, o) => sum + row[o], 0);
  assert.equal(total, row.sent, `${row.fault}: requests unaccounted for`);
}

before(async () => {
  makeModel(bin, tokenizerDir, model);
  routerPort = await freeRange(1);
  let workerBase;
  cluster = await retryOnPortClash(async () => {
    workerBase = await freeRange(9);
    return startCluster(bin, ['--model', model, '--workers', '3', '--curve=false',
      '--port', String(await freeRange(1)), '--base-port', String(workerBase), '--max-model-len', '2048',
      '--router-args', `--admin-token ${token}`, '--', '--num-blocks', '1024', '--max-num-seqs', '8',
      '--drain-timeout', '30']);
  });
  workers = [0, 1, 2].map((i) => `127.0.0.1:${workerBase + 3 * i}:${workerBase + 3 * i + 1}`);
  await startRouter();
});

after(async () => {
  console.log(`# chaos report (${seconds} s of load around each fault)`);
  for (const row of report) {
    console.log(`# ${row.fault}: ${OUTCOMES.map((o) => `${o} ${row[o]}`).join(', ')} of ${row.sent}; ` +
      `recovered in ${row.recover_s.toFixed(2)} s; p99 of ok ${row.p99_ok_ms} ms`);
    for (const o of ['clean', 'cut', 'hung', 'lost']) {
      for (const note of row.notes[o]) console.log(`#   ${o}: ${note}`);
    }
  }
  if (process.env.KVSERVE_CHAOS_REPORT) {
    fs.writeFileSync(process.env.KVSERVE_CHAOS_REPORT, JSON.stringify(report, null, 2));
  }
  for (const c of children) c.kill('SIGKILL');
  if (cluster && cluster.exitCode === null) {
    const exited = new Promise((r) => cluster.once('exit', r));
    cluster.kill('SIGTERM');
    await exited;
  }
  fs.rmSync(tmp, { recursive: true, force: true });
});

// Recovered: the worker runs as a new process (the supervisor restarted it) and every worker
// takes requests again.
const restarted = (name, instance) => async () => {
  const now = await admin();
  return now.every((w) => w.eligible) && now.find((w) => w.name === name).instance_id !== instance;
};

test('SIGKILL a worker', async () => {
  const instance = (await admin()).find((w) => w.name === workers[0]).instance_id;
  check(await underLoad('SIGKILL a worker', () => process.kill(workerPid(workers[0]), 'SIGKILL'),
    restarted(workers[0], instance)));
});

test('SIGSTOP a worker past the heartbeat timeout, then SIGCONT', async () => {
  check(await underLoad('SIGSTOP a worker 3 s, then SIGCONT', async () => {
    const pid = workerPid(workers[1]);
    process.kill(pid, 'SIGSTOP');
    await sleep(3000);
    process.kill(pid, 'SIGCONT');
  }, allEligible));
});

test('SIGSTOP a draining worker', async () => {
  check(await underLoad('SIGSTOP a draining worker 3 s', async () => {
    await control(workers[2], 'drain');
    const pid = workerPid(workers[2]);
    process.kill(pid, 'SIGSTOP');
    await sleep(3000);
    process.kill(pid, 'SIGCONT');
    await control(workers[2], 'undrain');
  }, allEligible));
});

test('restart the router (SIGTERM, then start it again)', async () => {
  check(await underLoad('restart the router', async () => {
    const exited = new Promise((r) => router.once('exit', r));
    router.kill('SIGTERM');
    await exited;
    await startRouter();
  }, async () => (await fetch(`${base()}/ready`)).status === 200));
});

test('recycle two workers with --max-unavailable 1', async () => {
  const before = await admin();
  const instances = Object.fromEntries(before.map((w) => [w.name, w.instance_id]));
  check(await underLoad('recycle two workers', async () => {
    await control(workers[0], 'recycle');
    await control(workers[1], 'recycle');
  }, async () => {
    const now = await admin();
    return now.every((w) => w.eligible) &&
      [workers[0], workers[1]].every((n) => now.find((w) => w.name === n).instance_id !== instances[n]);
  }));
});
