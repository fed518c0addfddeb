// Hostile clients against a real local cluster (kvserve-cluster: router + 2 CPU workers, API keys
// on): each abuse of issue 25's list gets its clear 400 / 401 naming the parameter and the limit,
// leaves nothing behind in the router's prefix index, and a well-behaved client running
// alongside is served throughout.
//
//   node hostile_client_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { freeRange, makeModel, startCluster } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-hostile-'));
const key = 'hostile-test-key';
const admin = 'hostile-test-admin';
let cluster;
let base;
let goodClient;
const good = { sent: 0, ok: 0, failures: [] };
let stopGood = false;

function post(route, body, auth = key) {
  const headers = { 'content-type': 'application/json' };
  if (auth) headers.authorization = `Bearer ${auth}`;
  return fetch(`${base}${route}`, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
}

// The OpenAI error of a refused request: its status and body.
async function refused(route, body, auth = key) {
  const r = await post(route, body, auth);
  return { status: r.status, error: (await r.json()).error };
}

async function indexBlocks() {
  const r = await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${admin}` } });
  assert.equal(r.status, 200);
  return (await r.json()).workers.reduce((sum, w) => sum + w.index_blocks, 0);
}

// A client that behaves: short chat completions one after another until told to stop.
async function behave() {
  while (!stopGood) {
    good.sent++;
    try {
      const r = await post('/v1/chat/completions', { model: 'tiny', max_tokens: 4,
        messages: [{ role: 'user', content: `hello ${good.sent}` }] });
      const body = await r.json();
      if (r.status === 200 && body.choices?.length === 1) good.ok++;
      else good.failures.push(`${r.status} ${JSON.stringify(body)}`);
    } catch (e) {
      good.failures.push(String(e));
    }
  }
}

before(async () => {
  makeModel(bin, tokenizerDir, path.join(tmp, 'tiny'));
  const http = await freeRange(1);
  cluster = await startCluster(bin, ['--model', path.join(tmp, 'tiny'), '--workers', '2', '--port', String(http),
    '--base-port', String(await freeRange(6)), '--max-model-len', '8192',
    '--router-args', `--api-keys ${key} --admin-token ${admin} --max-stop-strings 16 --max-logprob-entries 100000`,
    '--', '--num-blocks', '1024']);
  base = `http://127.0.0.1:${http}`;
  goodClient = behave();
});

after(async () => {
  stopGood = true;
  await goodClient;
  if (cluster) {
    cluster.kill('SIGTERM');
    await new Promise((r) => cluster.once('exit', r));
  }
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('max_tokens near 2^31 is context_length_exceeded at the router, and leaves no index entries', async () => {
  const before = await indexBlocks();
  const prompt = 'word '.repeat(4000);
  for (const maxTokens of [2147483647, 2147483600, 2147479000]) {
    const { status, error } = await refused('/v1/completions', { model: 'tiny', prompt, max_tokens: maxTokens });
    assert.equal(status, 400);
    assert.equal(error.code, 'context_length_exceeded', JSON.stringify(error));
  }
  assert.equal(await indexBlocks(), before);
});

test('stop strings and stop token ids are capped', async () => {
  let r = await refused('/v1/completions', { model: 'tiny', prompt: 'hi', stop: Array(100000).fill('x') });
  assert.equal(r.status, 400);
  assert.equal(r.error.param, 'stop');
  assert.match(r.error.message, /has 100000 strings; the limit is 16 \(--max-stop-strings\)/);
  r = await refused('/v1/completions', { model: 'tiny', prompt: 'hi', stop: 'y'.repeat(5000) });
  assert.match(r.error.message, /stop string has 5000 bytes; the limit is 1024/);
  r = await refused('/v1/completions', { model: 'tiny', prompt: 'hi', stop_token_ids: Array(200000).fill(7) });
  assert.equal(r.error.param, 'stop_token_ids');
  assert.match(r.error.message, /the limit is 1024 \(--max-stop-token-ids\)/);
});

test('logprobs memory is capped: n × max_tokens × (1 + alternatives)', async () => {
  const r = await refused('/v1/chat/completions', { model: 'tiny', n: 128, logprobs: true, top_logprobs: 20,
    max_tokens: 2000, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(r.status, 400);
  assert.equal(r.error.param, 'logprobs');
  assert.match(r.error.message, /128 × 2000 × 21 = 5376000 .* limit is 100000/);
});

test('messages and prompt text are capped before tokenization', async () => {
  let r = await refused('/v1/chat/completions', { model: 'tiny',
    messages: Array(5000).fill({ role: 'user', content: 'x' }) });
  assert.equal(r.error.param, 'messages');
  assert.match(r.error.message, /has 5000 messages; the limit is 4096/);
  // One 2 MB "word": refused by size (64 bytes per token of 8192 = 512 KiB, at least 1 MiB),
  // never tokenized on the I/O thread.
  r = await refused('/v1/completions', { model: 'tiny', prompt: 'a'.repeat(2 << 20) });
  assert.equal(r.error.param, 'prompt');
  assert.match(r.error.message, /the limit is 1048576 \(--max-prompt-bytes\)/);
  r = await refused('/tokenize', { model: 'tiny', prompt: 'a'.repeat(2 << 20) });
  assert.match(r.error.message, /prompt: has 2097152 bytes of text; the limit is 1048576/);
  r = await refused('/v1/completions', { model: 'tiny', prompt: Array(9000).fill(5) });
  assert.match(r.error.message, /has 9000 token ids; the model's context holds 8192/);
});

test('/tokenize and /detokenize follow the API-key policy; ids are not narrowed', async () => {
  for (const route of ['/tokenize', '/detokenize']) {
    const r = await post(route, { model: 'tiny', prompt: 'hi', tokens: [5] }, null);
    assert.equal(r.status, 401, route);
  }
  let r = await post('/detokenize', { tokens: [4294967301] });
  assert.equal(r.status, 400);
  assert.match((await r.json()).error.message, /non-negative 32-bit/);
  r = await post('/detokenize', { tokens: [-1] });
  assert.equal(r.status, 400);
  r = await post('/detokenize', { tokens: [5] });
  assert.equal(r.status, 200);
  r = await fetch(`${base}/v1/models`);
  assert.equal(r.status, 401);
});

test('the well-behaved client was served throughout', async () => {
  const deadline = Date.now() + 30000;
  while (good.ok < 10 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(good.failures, []);
  assert.ok(good.ok >= 10, `only ${good.ok} of ${good.sent} served`);
});
