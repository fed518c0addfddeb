// kvserve-bench serve against a real router and two CPU workers (a random-weight Llama with the
// real Llama 3 tokenizer): the shared-prefix dataset sent one request at a time reaches exactly
// the hit rate one unlimited cache would (prefix routing keeps each group on one worker) and
// splits the groups evenly; every metric is present and consistent; multi-turn and random
// datasets complete; bad options fail with a message naming the option.
//
//   node kvserve_bench_serve_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { freePort, makeModel, startAndWait as start } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-bench-'));
const model = path.join(tmp, 'tiny');
const children = [];
let url;



function bench(args) {
  const json = path.join(tmp, `report-${Math.random().toString(36).slice(2)}.json`);
  const r = spawnSync(path.join(bin, 'kvserve-bench'), ['serve', '--url', url, '--json-out', json, ...args],
    { encoding: 'utf8', timeout: 120000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr, report: fs.existsSync(json) ? JSON.parse(fs.readFileSync(json, 'utf8')) : null };
}

before(async () => {
  makeModel(bin, tokenizerDir, model);
  const workers = [];
  for (let i = 0; i < 2; i++) {
    const [port, events, metrics] = [await freePort(), await freePort(), await freePort()];
    await start(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1', '--port', String(port),
      '--events-port', String(events), '--metrics-port', String(metrics), '--max-model-len', '1024',
      '--num-blocks', '1024', '--worker-id', `w${i}`], /kvserve-worker ready/);
    workers.push(`127.0.0.1:${port}:${events}`);
  }
  const http = await freePort();
  await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
    '--workers', workers.join(','), '--max-model-len', '1024'], /kvserve-router: 2\/2 workers ready/);
  url = `http://127.0.0.1:${http}`;
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('shared-prefix, one at a time: the ideal hit rate, groups split evenly', () => {
  const { status, stdout, stderr, report: r } = bench(['--dataset', 'shared-prefix', '--gsp-num-groups', '4',
    '--gsp-prompts-per-group', '3', '--gsp-system-prompt-len', '64', '--gsp-question-len', '8',
    '--gsp-output-len', '4', '--max-concurrency', '1', '--seed', '5']);
  assert.equal(status, 0, stderr + stdout);
  assert.equal(r.completed, 12);
  assert.equal(r.failed, 0);
  assert.equal(r.total_input_tokens, 12 * 72);
  assert.equal(r.total_output_tokens, 12 * 4);
  // 8 of the 12 prompts find their group's 64-token system prompt (4 blocks of 16) cached.
  assert.equal(r.ideal_prefix_cache_hit_rate, (8 * 64) / (12 * 72));
  assert.equal(r.prefix_cache_hit_rate, r.ideal_prefix_cache_hit_rate);
  assert.deepEqual(Object.values(r.requests_per_worker).sort(), [6, 6]);
  for (const m of ['ttft', 'tpot', 'itl', 'e2el']) {
    for (const s of ['mean', 'median', 'p90', 'p99']) {
      assert.ok(Number.isFinite(r[`${s}_${m}_ms`]) && r[`${s}_${m}_ms`] >= 0, `${s}_${m}_ms`);
    }
    assert.ok(r[`median_${m}_ms`] <= r[`p99_${m}_ms`] + 1e-9, m);
  }
  assert.ok(r.mean_e2el_ms >= r.mean_ttft_ms);
  assert.ok(r.request_throughput > 0 && r.output_throughput > 0);
  assert.ok(Math.abs(r.total_token_throughput - (r.total_input_tokens + r.total_output_tokens) / r.duration) < 1e-6);
  assert.match(stdout, /Serving Benchmark Result/);
  assert.match(stdout, /Prefix cache hit rate:\s+0\.5926/);
});

test('random at a Poisson rate, and goodput under SLOs', () => {
  const loose = bench(['--dataset', 'random', '--num-prompts', '6', '--random-input-len', '32',
    '--random-output-len', '3', '--request-rate', '20', '--goodput', 'e2el:600000', '--json']);
  assert.equal(loose.status, 0, loose.stderr);
  assert.equal(loose.report.completed, 6);
  // --json prints the same report after the table.
  const printed = JSON.parse(loose.stdout.slice(loose.stdout.indexOf('{')));
  assert.equal(printed.completed, 6);
  assert.equal(printed.total_output_tokens, loose.report.total_output_tokens);
  assert.equal(loose.report.request_goodput, loose.report.request_throughput);
  const tight = bench(['--dataset', 'random', '--num-prompts', '4', '--random-input-len', '32',
    '--random-output-len', '3', '--goodput', 'ttft:0.000001']);
  assert.equal(tight.status, 0, tight.stderr);
  assert.equal(tight.report.request_goodput, 0);
});

test('multi-turn: every turn sends the history, later turns hit the cache', () => {
  const { status, stderr, report: r } = bench(['--dataset', 'multi-turn', '--multi-turn-conversations', '2',
    '--multi-turn-turns', '3', '--multi-turn-input-len', '40', '--multi-turn-output-len', '4']);
  assert.equal(status, 0, stderr);
  assert.equal(r.completed, 6);
  // Turn k's prompt holds turns 1..k-1 (prompts and answers): strictly more than 6 × 40 tokens.
  assert.ok(r.total_input_tokens > 6 * 40, String(r.total_input_tokens));
  assert.ok(r.prefix_cache_hit_rate > 0, String(r.prefix_cache_hit_rate));
});

test('bad options name the option', () => {
  for (const [args, pattern] of [
    [['--dataset', 'sharegpt'], /--dataset 'sharegpt'/],
    [['--request-rate', 'fast'], /--request-rate 'fast'/],
    [['--gsp-num-groups', '0', '--dataset', 'shared-prefix'], /--gsp-num-groups must be > 0/],
    [['--goodput', 'latency:5'], /--goodput names 'latency'/],
  ]) {
    const r = bench(args);
    assert.equal(r.status, 2, args.join(' '));
    assert.match(r.stderr, pattern);
  }
  const down = spawnSync(path.join(bin, 'kvserve-bench'), ['serve', '--url', 'http://127.0.0.1:1'], { encoding: 'utf8' });
  assert.equal(down.status, 1);
  assert.match(down.stderr, /127\.0\.0\.1:1/);
  const badUrl = spawnSync(path.join(bin, 'kvserve-bench'), ['serve', '--url', 'https://x:5/v1'], { encoding: 'utf8' });
  assert.equal(badUrl.status, 2);
  assert.match(badUrl.stderr, /--url 'https:\/\/x:5\/v1'/);
});
