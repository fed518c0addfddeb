// The chart's monitoring against a real Prometheus (Debian's) scraping a local kvserve-cluster
// (router + 2 CPU workers that recycle every 40 requests) under kvserve-bench serve load, with
// the chart's alert rules loaded: every dashboard query and every KEDA trigger returns data,
// every alert expression does too once its threshold is set so that it must fire, and every
// loaded rule evaluates without error.
//
//   node prometheus_monitoring_test.mjs REPO_ROOT BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { stringify } from 'yaml';

import { objects, render, writeAlertRules } from './lib/chart.mjs';
import { freeRange, makeModel, startCluster } from './lib/harness.mjs';

const [root, bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-prom-'));
const model = path.join(tmp, 'tiny');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let cluster;
let prometheus;
let promUrl;
let routerAddress;

// Thresholds that make every alert's condition true on a cluster that is merely serving.
const mustFire = ['kvUsageRatio=-1', 'preemptionsPerSecond=-1', 'swapBytesPerSecond=-1', 'prefixHitRate=2',
  'prefixHitRateBaseline=-1', 'routingAccuracy=1000', 'kvEventGapsPerSecond=-1', 'recyclesPerHour=-1',
  'errorRatio=-1', 'ttftP99Seconds=-1', 'readyWorkersRatio=100', 'refusedRatio=-1', 'queueWaitP99Seconds=-1',
  'connectionsRefusedPerSecond=-1', 'replyGapsPer15m=-1', 'kvFetchFallbackRatio=-1',
  'kvLinkFailuresPer15m=-1'].map((kv) => `monitoring.alerts.${kv}`);

async function query(expr) {
  const r = await fetch(`${promUrl}/api/v1/query?${new URLSearchParams({ query: expr })}`);
  const body = await r.json();
  assert.equal(body.status, 'success', `${expr}: ${body.error}`);
  return body.data.result;
}

async function startPrometheus(routerPort, workerBase) {
  const port = await freeRange(1);
  const workers = [0, 1].map((i) => `127.0.0.1:${workerBase + 3 * i + 2}`);
  const config = {
    global: { scrape_interval: '1s', evaluation_interval: '1s' },
    rule_files: ['rules.yml'],
    scrape_configs: [
      { job_name: 'kvserve-router', static_configs: [{ targets: [`127.0.0.1:${routerPort}`], labels: { namespace: 'default' } }] },
      { job_name: 'kvserve-worker', static_configs: [{ targets: workers, labels: { namespace: 'default' } }] },
    ],
  };
  fs.writeFileSync(path.join(tmp, 'prometheus.yml'), stringify(config));
  prometheus = spawn('prometheus', [`--config.file=${path.join(tmp, 'prometheus.yml')}`,
    `--storage.tsdb.path=${path.join(tmp, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'],
  { stdio: ['ignore', 'ignore', 'inherit'] });
  promUrl = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 600; i++) {
    const ok = await fetch(`${promUrl}/-/ready`).then((r) => r.ok, () => false);
    if (ok) return;
    await sleep(100);
  }
  throw new Error('prometheus did not get ready');
}

before(async () => {
  makeModel(bin, tokenizerDir, model);
  writeAlertRules(root, [], path.join(tmp, 'rules.yml'));
  const check = spawnSync('promtool', ['check', 'rules', path.join(tmp, 'rules.yml')], { encoding: 'utf8' });
  assert.equal(check.status, 0, check.stdout + check.stderr);
  const http = await freeRange(1);
  const workerBase = await freeRange(6);
  cluster = await startCluster(bin, ['--model', model, '--workers', '2', '--port', String(http),
    '--base-port', String(workerBase), '--max-model-len', '1024',
    // Peer fetches happen when a recycling worker's groups move to the other worker. With
    // --kv-links the link series exist at 0 (CPU workers join no link).
    '--router-args', '--kv-fetch --kv-fetch-min-blocks 2 --kv-links', '--', '--num-blocks', '256',
    '--recycle-after-requests', '40']);
  routerAddress = `127.0.0.1:${http}`;
  await startPrometheus(http, workerBase);
  // The load must fall between scrapes of every target, not before the first one.
  for (let i = 0; (await query('count(up == 1)'))[0]?.value[1] !== '3'; i++) {
    assert.ok(i < 300, 'prometheus never scraped all three targets');
    await sleep(100);
  }
  const bench = spawnSync(path.join(bin, 'kvserve-bench'), ['serve', '--url', `http://127.0.0.1:${http}`,
    '--dataset', 'shared-prefix', '--gsp-num-groups', '4', '--gsp-prompts-per-group', '30',
    '--gsp-system-prompt-len', '64', '--gsp-question-len', '8', '--gsp-output-len', '8',
    '--max-concurrency', '4', '--seed', '3'], { encoding: 'utf8', timeout: 300000 });
  assert.equal(bench.status, 0, bench.stdout + bench.stderr);
  // A few more scrapes and rule evaluations after the load.
  await sleep(5000);
});

after(async () => {
  for (const p of [prometheus, cluster]) {
    if (p && p.exitCode === null) {
      p.kill('SIGTERM');
      await new Promise((r) => p.once('exit', r));
    }
  }
  fs.rmSync(tmp, { recursive: true, force: true });
});

// A dashboard query as Grafana sends it with "All" selected.
function grafanaQuery(expr) {
  return expr.replaceAll('$__rate_interval', '1m').replaceAll('$namespace', '.*').replaceAll('$worker', '.*');
}

test('every dashboard query returns data', async () => {
  const dir = path.join(root, 'deploy/helm/kvserve/dashboards');
  let n = 0;
  for (const file of fs.readdirSync(dir)) {
    const dashboard = JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'));
    for (const panel of dashboard.panels) {
      for (const target of panel.targets) {
        const result = await query(grafanaQuery(target.expr));
        assert.ok(result.length > 0, `${file} "${panel.title}": no data for ${target.expr}`);
        n++;
      }
    }
  }
  assert.ok(n >= 30, `only ${n} queries`);
});

test('the planned recycles show up by reason', async () => {
  const result = await query('sum(kvserve_recycles_total{reason="requests"})');
  assert.ok(Number(result[0].value[1]) >= 1, JSON.stringify(result));
});

test('every alert expression returns data when its threshold must be crossed', async () => {
  const rules = writeAlertRules(root, mustFire.flatMap((s) => ['--set', s]), path.join(tmp, 'forced.yml'));
  for (const rule of rules) {
    // NoReadyWorker compares with 0 and cannot be forced; its count must be there all the same.
    const expr = rule.alert === 'NoReadyWorker' ? rule.expr.replace(/\s*==\s*0$/, '') : rule.expr;
    const result = await query(expr);
    assert.ok(result.length > 0, `${rule.alert}: no data for ${expr}`);
  }
});

test('every loaded rule evaluates without error', async () => {
  const body = await (await fetch(`${promUrl}/api/v1/rules`)).json();
  const rules = body.data.groups.flatMap((g) => g.rules);
  assert.equal(rules.length, 17);
  for (const r of rules) {
    assert.equal(r.health, 'ok', `${r.name}: ${r.lastError}`);
    assert.notEqual(r.lastEvaluation, '0001-01-01T00:00:00Z', `${r.name} never evaluated`);
  }
});

test('the KEDA triggers return data', async () => {
  const out = render(root, ['--set', 'worker.keda.enabled=true', '--set', 'model.name=tiny',
    '--show-only', 'templates/worker-keda.yaml']);
  assert.equal(out.status, 0, out.stderr);
  const [scaled] = objects(out.stdout);
  for (const trigger of scaled.spec.triggers) {
    const result = await query(trigger.metadata.query);
    assert.ok(result.length > 0, `no data for ${trigger.metadata.query}`);
  }
});

test('the helm test pod lists the model (its script, run here with wget)', () => {
  const out = render(root, ['--set', 'model.name=tiny', '--show-only', 'templates/tests/test-models.yaml']);
  assert.equal(out.status, 0, out.stderr);
  const [pod] = objects(out.stdout);
  const c = pod.spec.containers[0];
  const env = Object.fromEntries(c.env.filter((e) => e.value !== undefined).map((e) => [e.name, e.value]));
  const run = (model) => spawnSync(c.command[0], [...c.command.slice(1), ...c.args],
    { encoding: 'utf8', env: { PATH: process.env.PATH, ...env, ROUTER: routerAddress, MODEL_NAME: model } });
  let r = run('tiny');
  assert.equal(r.status, 0, r.stdout + r.stderr);
  r = run('not-served');
  assert.notEqual(r.status, 0, 'passed for a model the router does not serve');
});
