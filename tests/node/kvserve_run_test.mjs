// kvserve-run as a user drives it: --prompt-ids-file with a fixture's reference.json and
// --dump-logits reproduce transformers' logits; bad inputs exit non-zero with one line.
//
//   node kvserve_run_test.mjs BUILD/bin/kvserve-run FIXTURES_DIR
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { readSafetensors } from './lib/safetensors.mjs';

const [binary, fixtures] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-run-'));
process.on('exit', () => fs.rmSync(tmp, { recursive: true, force: true }));

function run(args) {
  return spawnSync(binary, args, { encoding: 'utf8' });
}

for (const model of ['tiny-llama3', 'tiny-qwen2', 'tiny-qwen3']) {
  test(`${model}: --dump-logits matches transformers`, () => {
    const dir = path.join(fixtures, model);
    const out = path.join(tmp, `${model}.safetensors`);
    const res = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'),
      '--max-tokens', '4', '--dump-logits', out, '--json', '--block-size', '8', '--max-num-batched-tokens', '50']);
    assert.equal(res.status, 0, res.stderr);
    assert.match(res.stderr, /KV bytes per token/);
    const lines = res.stdout.trim().split('\n').map((l) => JSON.parse(l));
    const summary = lines.pop();
    assert.equal(lines.length, 3);
    for (const l of lines) assert.equal(l.token_ids.length, 4);
    assert.ok(summary.tokens_per_s > 0);
    const ours = readSafetensors(out);
    const ref = readSafetensors(path.join(dir, 'reference_logits.safetensors'));
    for (const [name, t] of Object.entries(ref)) {
      assert.deepEqual(ours[name].shape, t.shape);
      let maxRef = 0, maxErr = 0;
      for (let i = 0; i < t.data.length; i++) {
        maxRef = Math.max(maxRef, Math.abs(t.data[i]));
        maxErr = Math.max(maxErr, Math.abs(t.data[i] - ours[name].data[i]));
      }
      assert.ok(maxErr / maxRef < 1e-4, `${name}: relative error ${maxErr / maxRef}`);
    }
  });
}

test('KV memory flags reach the engine', () => {
  const dir = path.join(fixtures, 'tiny-llama3');
  const res = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--max-tokens', '4',
    '--kv-cache-dtype', 'int4', '--kv-quant-granularity', 'k:per_channel,v:per_token', '--kv-full-precision-layers', 'first:1',
    '--swap-space', '0.01', '--preemption-mode', 'swap', '--host-prefix-cache', '--json']);
  assert.equal(res.status, 0, res.stderr);
  assert.match(res.stderr, /K int4\/per_channel, V int4\/per_token \(layers: 0-0:fp32,fp32;1-2:int4\/per_channel,int4\/per_token\)/);
  assert.match(res.stderr, /host tier +\d+ blocks/);
  assert.match(res.stderr, /swap on, host prefix cache on/);
  let bad = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--kv-cache-dtype', 'int3']);
  assert.match(bad.stderr, /--kv-cache-dtype 'int3'/);
  bad = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--host-prefix-cache']);
  assert.match(bad.stderr, /--host-prefix-cache needs a host tier/);
  bad = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--kv-cache-dtype', 'int8',
    '--kv-quant-granularity', 'per_group', '--kv-quant-group-size', '32']);
  assert.match(bad.stderr, /--kv-quant-group-size 32 must be a power of two >= 8 that divides head_dim \(16\)/);
  bad = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--kv-full-precision-layers', 'last:9']);
  assert.match(bad.stderr, /last:9/);
});

test('tensor parallel: same output as one rank; a failing rank exits non-zero in bounded time', () => {
  const dir = path.join(fixtures, 'tiny-llama3');
  const args = ['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--max-tokens', '6', '--json'];
  const one = run(args);
  const two = run([...args, '--tensor-parallel-size', '2']);
  assert.equal(two.status, 0, two.stderr);
  assert.match(two.stderr, /tensor parallel +2 rank\(s\) \(gloo\), 1 KV head\(s\) per rank/);
  const ids = (r) => r.stdout.trim().split('\n').slice(0, 3).map((l) => JSON.parse(l).token_ids);
  assert.deepEqual(ids(two), ids(one));
  const start = Date.now();
  const bad = run([...args, '--tensor-parallel-size', '2', '--tp-timeout-seconds', '1', '--tp-fault-injection', '1:2:stall']);
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /tensor-parallel rank/);
  assert.ok(Date.now() - start < 20000, `took ${Date.now() - start} ms`);
});

test('bad inputs exit non-zero with a reason', () => {
  const dir = path.join(fixtures, 'tiny-qwen3');
  let res = run(['--prompt-ids-file', path.join(dir, 'reference.json')]);
  assert.notEqual(res.status, 0);
  assert.match(res.stderr, /--model DIR is required/);
  const bad = path.join(tmp, 'bad.json');
  fs.writeFileSync(bad, JSON.stringify({ prompts: [[1, 2, 99999]] }));
  res = run(['--model', dir, '--prompt-ids-file', bad]);
  assert.notEqual(res.status, 0);
  assert.match(res.stderr, /prompt 0: prompt token 2 is 99999/);
  res = run(['--model', dir, '--prompt-ids-file', bad, '--block-size', '7']);
  assert.match(res.stderr, /--block-size must be 8, 16 or 32/);
  res = run(['--model', dir, '--prompt-ids-file', path.join(dir, 'reference.json'), '--max-model-len', '100000']);
  assert.match(res.stderr, /max_position_embeddings/);
  res = run(['--model', dir, '--prompt', 'hi']);
  assert.match(res.stderr, /needs a tokenizer/);
});
