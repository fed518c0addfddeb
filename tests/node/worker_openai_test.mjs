// kvserve-worker --openai-port: one worker serving the OpenAI API itself, as a vLLM pod does,
// checked with the official `openai` npm client: /v1/models, chat and completions (streamed and
// not), /tokenize, /ready, /metrics with vLLM's gauge names; greedy outputs equal those of a
// kvserve-router in front of the same worker; CURVE workers serve it through the key the front
// makes for itself; API keys guard /v1/*; bad flags stop the worker with a message naming them.
//
//   node worker_openai_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';

import { freePort, makeModel, retryOnPortClash, startAndWait, startRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-worker-openai-'));
const model = path.join(tmp, 'tiny');
const children = [];
let worker;  // { base, zmq: 'host:port:events' }

// A worker with --openai-port on free loopback ports; resolves once its front counts it ready.
function startWorker(extra = []) {
  return retryOnPortClash(async () => {
    const [port, events, metrics, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
    await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1',
      '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
      '--openai-port', String(http), '--max-model-len', '1024', '--num-blocks', '256', ...extra],
    /kvserve-worker ready/);
    const base = `http://127.0.0.1:${http}`;
    for (let i = 0; i < 200 && (await fetch(`${base}/ready`)).status !== 200; i++) {
      await new Promise((res) => setTimeout(res, 50));
    }
    return { base, zmq: `127.0.0.1:${port}:${events}` };
  });
}

const client = (base, apiKey = 'unused') => new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });

before(async () => {
  makeModel(bin, tokenizerDir, model);
  worker = await startWorker(['--served-model-name', 'tiny-served']);
});

after(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('the worker serves models, chat, completions and /tokenize itself', async () => {
  const c = client(worker.base);
  const models = await c.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['tiny-served']);
  const chat = await c.chat.completions.create({ model: 'tiny-served', messages: [{ role: 'user', content: 'hi' }],
    max_tokens: 5, temperature: 0 });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.usage.completion_tokens, 5);
  assert.ok(chat.usage.prompt_tokens > 1);
  const stream = await c.completions.create({ model: 'tiny-served', prompt: 'The sky is', max_tokens: 4,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '', usage;
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].text;
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(usage.completion_tokens, 4);
  const whole = await c.completions.create({ model: 'tiny-served', prompt: 'The sky is', max_tokens: 4, temperature: 0 });
  assert.equal(text, whole.choices[0].text, 'streamed and whole greedy texts agree');
  const tok = await (await fetch(`${worker.base}/tokenize`, { method: 'POST',
    body: JSON.stringify({ model: 'tiny-served', prompt: 'The sky is' }) })).json();
  assert.equal(tok.count, whole.usage.prompt_tokens);
  await assert.rejects(c.chat.completions.create({ model: 'other', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 404 && /other/.test(e.message));
});

test('/metrics carries the worker\'s gauges under vLLM\'s names beside the front\'s own', async () => {
  const text = await (await fetch(`${worker.base}/metrics`)).text();
  for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
    'kvserve_router_requests_total', 'kvserve_kv_blocks']) {
    assert.match(text, new RegExp(`^${name}[{ ]`, 'm'), name);
  }
  const families = [...text.matchAll(/^# TYPE (\S+)/gm)].map((m) => m[1]);
  assert.equal(new Set(families).size, families.length, 'no metric family twice');
});

test('greedy outputs equal a kvserve-router\'s in front of the same worker', async () => {
  const routed = await startRouter(bin, model, children, worker.zmq, ['--served-model-name', 'tiny-served']);
  for (const prompt of ['Once upon a time', 'def fib(n):', '1, 2, 3,']) {
    const ask = (base) => client(base).completions.create({ model: 'tiny-served', prompt, max_tokens: 8,
      temperature: 0, logprobs: 2 });
    const [a, b] = await Promise.all([ask(worker.base), ask(routed)]);
    assert.equal(a.choices[0].text, b.choices[0].text, prompt);
    assert.deepEqual(a.choices[0].logprobs.tokens, b.choices[0].logprobs.tokens, prompt);
  }
});

test('a CURVE worker serves the API through the key its front made', async () => {
  const keys = path.join(tmp, 'keys');
  const clients = path.join(tmp, 'clients');
  fs.mkdirSync(keys);
  fs.mkdirSync(clients);
  const made = spawnSync(path.join(bin, 'kvserve-keygen'), ['--dir', keys, 'worker', 'router'], { encoding: 'utf8' });
  assert.equal(made.status, 0, made.stderr);
  fs.copyFileSync(path.join(keys, 'router.pub'), path.join(clients, 'router.pub'));
  const w = await startWorker(['--curve-secret-key-file', path.join(keys, 'worker.key'),
    '--curve-allowed-clients-dir', clients, '--api-keys', 'sk-one']);
  assert.equal((await fetch(`${w.base}/ready`)).status, 200, 'the front reached its CURVE worker');
  const r = await client(w.base, 'sk-one').completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 3 });
  assert.equal(r.usage.completion_tokens, 3);
  await assert.rejects(client(w.base, 'sk-wrong').completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 1 }),
    (e) => e.status === 401);
});

test('bad --openai-* flags stop the worker naming the flag', () => {
  for (const [args, want] of [
    [['--openai-port', '70000'], /--openai-port must be in 0\.\.65535/],
    [['--openai-port', '0', '--openai-host', '0.0.0.0'], /--openai-host 0\.0\.0\.0 is not loopback: give --api-keys/],
    [['--openai-port', '0', '--tool-call-parser', 'nope', '--enable-auto-tool-choice'], /nope/],
  ]) {
    const r = spawnSync(path.join(bin, 'kvserve-worker'), ['--model', model, '--port', '0', '--events-port', '0',
      '--metrics-port', '0', '--num-blocks', '64', '--max-model-len', '1024', ...args], { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.status, 1, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, want);
  }
});

test('SIGTERM: a stream open on the front ends whole, then the worker exits 0', async () => {
  const w = await startWorker();
  const child = children[children.length - 1];
  const exited = new Promise((res) => child.on('exit', (code) => res(code)));
  const stream = await client(w.base).completions.create({ model: 'tiny', prompt: 'Count:', max_tokens: 60,
    temperature: 0, stream: true, stream_options: { include_usage: true }, ignore_eos: true });
  let usage, chunks = 0;
  for await (const chunk of stream) {
    if (++chunks === 2) child.kill('SIGTERM');
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(usage.completion_tokens, 60, 'the stream ran to its end through the drain');
  assert.equal(await exited, 0);
});

test('the front answers no recycle ask: a worker with no router in front is never granted one', async () => {
  const w = await startWorker(['--recycle-after-requests', '1', '--heartbeat-ms', '50',
    '--recycle-grant-hold-ms', '150']);
  await client(w.base).completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 2 });
  // It asks every heartbeat from now on; a grant would drain it within a few of them.
  await new Promise((res) => setTimeout(res, 1500));
  assert.equal((await fetch(`${w.base}/ready`)).status, 200, 'still in rotation');
  const metrics = await (await fetch(`${w.base}/metrics`)).text();
  assert.doesNotMatch(metrics, /^kvserve_recycles_total\{[^}]*\} [1-9]/m);
  assert.equal((await client(w.base).completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 2 }))
    .usage.completion_tokens, 2);
});
