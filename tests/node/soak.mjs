// Soak (issue 26; label slow, not in CI): a local cluster (kvserve-cluster, two CPU workers)
// under mixed traffic for a long time: streamed and whole chat completions, every fifth one
// abandoned midway by its client. Samples the router's and workers' RSS every 30 s; at the end
// checks that no request hung or lost tokens, that nothing is left running or holding KV
// blocks, that the requests the router placed equal those the workers ended, and prints the RSS
// growth after warm-up per hour (docs/RELIABILITY.md).
//
//   node soak.mjs BUILD_BIN_DIR TOKENIZER_DIR [MINUTES (30)] [WARMUP_MINUTES (5)]
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { freeRange, makeModel, startCluster } from './lib/harness.mjs';
import { OUTCOMES, percentile, startLoad } from './lib/load.mjs';

const [bin, tokenizerDir, minutesArg, warmupArg] = process.argv.slice(2);
const minutes = Number(minutesArg ?? 30);
const warmup = Number(warmupArg ?? 5);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-soak-'));
const model = path.join(tmp, 'tiny');
const token = 'soak-admin';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function pidsOf(binary) {
  const pids = [];
  for (const pid of fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let cmd;
    try { cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0'); } catch { continue; }
    if (cmd[0] && cmd[0].endsWith(binary) && cmd.includes(model)) pids.push(Number(pid));
  }
  return pids;
}

function rssMib(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(status)[1]) / 1024;
}

// The sum of a metric's series in a Prometheus text page.
function metricSum(text, name) {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.split(' ').pop());
  }
  return sum;
}

makeModel(bin, tokenizerDir, model);
const port = await freeRange(1);
const workerBase = await freeRange(6);
const cluster = await startCluster(bin, ['--model', model, '--workers', '2', '--port', String(port),
  '--base-port', String(workerBase), '--max-model-len', '2048', '--router-args', `--admin-token ${token}`,
  '--', '--num-blocks', '2048', '--max-num-seqs', '16']);
const base = `http://127.0.0.1:${port}`;
const [router] = pidsOf('kvserve-router');
const workers = pidsOf('kvserve-worker');
const load = startLoad(base, { clients: 6, maxTokens: 32, abandonEvery: 5, hangMs: 120000 });
const t0 = Date.now();
const samples = [];
console.log('minute  router_rss_mib  worker_rss_mib (each)  sent');
while (Date.now() - t0 < minutes * 60000) {
  await sleep(30000);
  const sample = { minute: (Date.now() - t0) / 60000, router: rssMib(router), workers: workers.map(rssMib) };
  samples.push(sample);
  console.log(`${sample.minute.toFixed(1).padStart(6)}  ${sample.router.toFixed(1).padStart(14)}  ` +
    `${sample.workers.map((w) => w.toFixed(1)).join(' ').padStart(21)}  ${load.sent()}`);
}
await load.stop();
await sleep(2000);

const first = samples.find((s) => s.minute >= warmup) ?? samples[0];
const last = samples.at(-1);
const hours = (last.minute - first.minute) / 60;
const growth = (before, after) => (hours > 0 ? ((after - before) / before) * 100 / hours : 0);
const workerStates = (await (await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${token}` } })).json()).workers;
const routerMetrics = await (await fetch(`${base}/metrics`)).text();
let ended = 0;
for (let i = 0; i < 2; i++) {
  const text = await (await fetch(`http://127.0.0.1:${workerBase + 3 * i + 2}/metrics`)).text();
  ended += metricSum(text, 'kvserve_requests_finished_total');
}
const routed = metricSum(routerMetrics, 'kvserve_router_routed_total');
const report = {
  minutes, warmup_minutes: warmup, sent: load.sent(), ...load.counts,
  p50_ok_ms: percentile(load.latencies, 50), p99_ok_ms: percentile(load.latencies, 99),
  router_rss_mib: { after_warmup: first.router, end: last.router, growth_pct_per_hour: growth(first.router, last.router) },
  worker_rss_mib: workers.map((_, i) => ({ after_warmup: first.workers[i], end: last.workers[i],
    growth_pct_per_hour: growth(first.workers[i], last.workers[i]) })),
  routed, ended_at_workers: ended,
  left_running: workerStates.map((w) => ({ running: w.num_running, waiting: w.num_waiting, active_blocks: w.device_blocks.active })),
};
console.log(JSON.stringify(report, null, 2));
cluster.kill('SIGTERM');
await new Promise((r) => cluster.once('exit', r));
fs.rmSync(tmp, { recursive: true, force: true });

assert.equal(report.hung, 0, 'requests hung');
assert.equal(report.lost, 0, 'successes with tokens missing');
assert.equal(OUTCOMES.reduce((s, o) => s + report[o], 0), report.sent, 'requests unaccounted for');
for (const w of report.left_running) assert.deepEqual(w, { running: 0, waiting: 0, active_blocks: 0 });
assert.equal(routed, ended, 'requests placed on workers != requests the workers ended');
