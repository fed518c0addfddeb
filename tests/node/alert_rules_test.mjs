// The chart's alerts: the PrometheusRule rendered with the default thresholds passes
// `promtool check rules` and the unit tests of tests/deploy/alerts_test.yaml (each alert
// firing, and quiet on healthy series); thresholds come from the values.
//
//   node alert_rules_test.mjs REPO_ROOT
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';

import { writeAlertRules } from './lib/chart.mjs';

const [root] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-alerts-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function promtool(...args) {
  const r = spawnSync('promtool', args, { encoding: 'utf8', cwd: tmp });
  return { status: r.status, out: r.stdout + r.stderr };
}

test('promtool check rules and the unit tests pass', () => {
  const rules = writeAlertRules(root, [], path.join(tmp, 'rules.yml'));
  assert.deepEqual(rules.map((r) => r.alert).sort(), ['ConnectionsRefused', 'ErrorRateHigh', 'KVCacheUsageHigh',
    'KVEventGaps', 'KVFetchFailing', 'KVLinkFailing', 'NoReadyWorker', 'PreemptionStorm', 'PrefixHitRateCollapse', 'QueueWaitHigh',
    'RecyclesTooFrequent', 'ReplyGaps', 'RequestsRefused', 'RoutingAccuracyLow', 'SwapThrash', 'TTFTHigh',
    'WorkersMissing']);
  let r = promtool('check', 'rules', 'rules.yml');
  assert.equal(r.status, 0, r.out);
  fs.copyFileSync(path.join(root, 'tests/deploy/alerts_test.yaml'), path.join(tmp, 'alerts_test.yaml'));
  r = promtool('test', 'rules', 'alerts_test.yaml');
  assert.equal(r.status, 0, r.out);
});

test('thresholds are values: a raised one keeps the alert quiet', () => {
  writeAlertRules(root, ['--set', 'monitoring.alerts.kvUsageRatio=0.99'], path.join(tmp, 'rules.yml'));
  fs.copyFileSync(path.join(root, 'tests/deploy/alerts_test.yaml'), path.join(tmp, 'alerts_test.yaml'));
  const r = promtool('test', 'rules', 'alerts_test.yaml');
  assert.notEqual(r.status, 0);
  assert.match(r.out, /alertname: KVCacheUsageHigh/);
});
