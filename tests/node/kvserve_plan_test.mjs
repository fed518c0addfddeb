// kvserve-plan from the command line: the worked examples through --json, the table, and
// clear errors.
//
//   node kvserve_plan_test.mjs BUILD/bin/kvserve-plan FIXTURES_DIR
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';

const [binary, fixtures] = process.argv.slice(2);
const GiB = 2 ** 30;
const llama8b = ['--num-layers', '32', '--num-kv-heads', '8', '--head-dim', '128'];

function plan(args) {
  const res = spawnSync(binary, args, { encoding: 'utf8' });
  return { ...res, rows: res.status === 0 && args.includes('--json') ? res.stdout.trim().split('\n').map((l) => JSON.parse(l)) : [] };
}

test('worked examples', () => {
  let r = plan([...llama8b, '--kv-cache-dtype', 'fp16', '--num-seqs', '4', '--seq-len', '8192', '--json']);
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.rows[0].kv_bytes_per_layer_per_request, 32 * 2 ** 20);
  assert.equal(r.rows[0].kv_cache_bytes, 4 * GiB);
  r = plan([...llama8b, '--kv-cache-dtype', 'fp16', '--num-seqs', '100', '--seq-len', '2048', '--json']);
  assert.equal(r.rows[0].kv_cache_bytes, 25 * GiB);
  const mha = plan(['--num-layers', '32', '--num-kv-heads', '32', '--head-dim', '128', '--kv-cache-dtype', 'fp16', '--json']);
  const gqa = plan([...llama8b, '--kv-cache-dtype', 'fp16', '--json']);
  assert.equal(mha.rows[0].kv_bytes_per_token, 4 * gqa.rows[0].kv_bytes_per_token);
  const int8 = plan([...llama8b, '--kv-cache-dtype', 'int8', '--kv-quant-granularity', 'per_group', '--kv-quant-group-size', '128', '--json']);
  assert.equal(int8.rows[0].kv_bytes_per_token, gqa.rows[0].kv_bytes_per_token * (1 / 2 + 1 / 128));
});

test('a table per KV dtype, from a model directory', () => {
  const r = spawnSync(binary, ['--model', path.join(fixtures, 'tiny-qwen3'), '--gpu-memory', '8'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  for (const f of ['fp16', 'bf16', 'fp8_e4m3/per_token', 'int8/per_token', 'int4/per_token']) assert.match(r.stdout, new RegExp(f));
  assert.match(r.stdout, /2 layers, 1 KV heads x 32 head_dim/);
});

test('bad flags name the problem', () => {
  let r = plan(['--num-layers', '32']);
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /--num-kv-heads/);
  r = plan([...llama8b, '--tensor-parallel-size', '3']);
  assert.match(r.stderr, /--tensor-parallel-size 3/);
  r = plan([...llama8b, '--kv-cache-dtype', 'int3']);
  assert.match(r.stderr, /'int3'/);
  r = plan([...llama8b, '--kv-cache-dtype', 'int8', '--kv-quant-granularity', 'per_group', '--kv-quant-group-size', '100']);
  assert.match(r.stderr, /--kv-quant-group-size 100/);
});
