// Shared by the chart tests: rendering deploy/helm/kvserve with deploy/helm/template.sh and
// reading what it prints.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { parseAllDocuments, stringify } from 'yaml';

// Runs template.sh with `args`; {status, stdout, stderr}.
export function render(root, args) {
  const r = spawnSync('bash', [path.join(root, 'deploy/helm/template.sh'), ...args], { encoding: 'utf8' });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

// The objects of a multi-document YAML text; a duplicate key or bad syntax fails.
export function objects(text) {
  return parseAllDocuments(text).map((d) => {
    assert.equal(d.errors.length, 0, String(d.errors));
    return d.toJS();
  }).filter((o) => o);
}

// Renders the chart's PrometheusRule with `args` and writes its groups as a Prometheus rule
// file at `file`; returns the rules (alerts) as a flat list.
export function writeAlertRules(root, args, file) {
  const r = render(root, ['--set', 'monitoring.prometheusRule.enabled=true',
    '--show-only', 'templates/prometheusrule.yaml', ...args]);
  assert.equal(r.status, 0, r.stderr);
  const [rule] = objects(r.stdout);
  fs.writeFileSync(file, stringify({ groups: rule.spec.groups }));
  return rule.spec.groups.flatMap((g) => g.rules);
}
