// kvserve-upstream: OpenAI-compatible servers the router does not run, routed by their cache as
// learned from their vLLM-format KV events only. The upstreams here are kvserve workers serving
// the OpenAI API themselves (--openai-port) and publishing vLLM's events (--kv-events-config):
// no vLLM can run on this machine, and kvserve's own server speaks the same formats.
//
// The hit-rate check: two workers' caches are filled first, each with two prompt families; a
// router started afterwards must send each family back to the worker that holds it. Over
// kvserve's protobuf events (router -> workers directly) that is the snapshot at join; over the
// bridge it is only the replayed vLLM events, re-hashed. Both routers must reach the same hit
// rate on the same workload. Then streams, logprobs equal to the direct path, an abort that
// reaches the upstream, and the bridge's errors.
//
//   node upstream_bridge_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';

import { freePort, freeRange, makeModel, retryOnPortClash, startAndWait, startRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-upstream-'));
const model = path.join(tmp, 'tiny');
const children = [];
const BLOCK = 16;

// A worker serving OpenAI itself and vLLM-format events on ports `p`; its addresses and process.
async function launchWorker(tag, p, pub = `ipc://${tmp}/${tag}-events.sock`) {
  const config = { enable_kv_cache_events: true, publisher: 'zmq', endpoint: pub,
    replay_endpoint: `tcp://127.0.0.1:${p.replay}`, buffer_steps: 10000 };
  const child = await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1',
    '--port', String(p.port), '--events-port', String(p.events), '--metrics-port', String(p.metrics),
    '--openai-port', String(p.http), '--max-model-len', '1024', '--num-blocks', '512', '--block-size', String(BLOCK),
    '--kv-events-config', JSON.stringify(config)], /kvserve-worker ready/);
  const base = `http://127.0.0.1:${p.http}`;
  for (let i = 0; i < 200 && (await fetch(`${base}/ready`)).status !== 200; i++) {
    await new Promise((res) => setTimeout(res, 50));
  }
  return { base, zmq: `127.0.0.1:${p.port}:${p.events}`, pub, replay: `tcp://127.0.0.1:${p.replay}`, child, ports: p, tag };
}

function startWorker(tag) {
  return retryOnPortClash(async () => launchWorker(tag, { port: await freePort(), events: await freePort(),
    metrics: await freePort(), http: await freePort(), replay: await freePort() }));
}

// A bridge in front of `w`; its worker address for a router.
function startBridge(w, extra = []) {
  return retryOnPortClash(async () => {
    const [port, events, metrics] = [await freePort(), await freePort(), await freePort()];
    await startAndWait(children, path.join(bin, 'kvserve-upstream'), ['--url', w.base,
      '--kv-events-endpoint', w.pub, '--kv-replay-endpoint', w.replay, '--port', String(port),
      '--events-port', String(events), '--metrics-port', String(metrics), '--scrape-interval-ms', '100',
      ...extra], /kvserve-upstream ready/);
    return { zmq: `127.0.0.1:${port}:${events}`, metrics: `http://127.0.0.1:${metrics}` };
  });
}

const client = (base) => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
// Prompt families: a long shared prefix (many blocks) and a short distinct tail.
const family = (f) => `Family ${f}: ` + Array.from({ length: 60 }, (_, i) => `w${f}x${i}`).join(' ');
const ask = (base, prompt, extra = {}) => client(base).completions.create({ model: 'tiny', prompt, max_tokens: 2,
  temperature: 0, ...extra });

let direct, bridged;  // { workers, router }

// Fills two workers' caches (families 0, 2 on the first; 1, 3 on the second) through their
// own OpenAI ports, then starts `makeRouter` over them and measures its hit rate on new tails.
async function hitRate(workers, routerBase) {
  let prompt = 0, cached = 0;
  for (let round = 0; round < 2; round++) {
    for (let f = 0; f < 4; f++) {
      const r = await ask(routerBase, `${family(f)} tail ${round}-${f}`);
      prompt += r.usage.prompt_tokens;
      cached += r.usage.prompt_tokens_details.cached_tokens;
    }
  }
  return cached / prompt;
}

async function warm(workers) {
  for (let f = 0; f < 4; f++) await ask(workers[f % 2].base, `${family(f)} warm`);
}

// The router's view is ready when /admin/workers shows both workers' blocks indexed.
async function waitIndexed(base, token) {
  let last;
  for (let i = 0; i < 200; i++) {
    const r = await fetch(`${base}/admin/workers`, { headers: { authorization: `Bearer ${token}` } });
    last = await r.text();
    if (r.status === 200) {
      const ws = JSON.parse(last).workers ?? [];
      if (ws.length === 2 && ws.every((w) => w.eligible && w.router.index_blocks >= 8)) return ws;
    }
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`the router never indexed both workers' caches: ${last}`);
}

before(async () => {
  makeModel(bin, tokenizerDir, model);
  const a = [await startWorker('a0'), await startWorker('a1')];
  const b = [await startWorker('b0'), await startWorker('b1')];
  await warm(a);
  await warm(b);
  const token = 'admin-token';
  const opts = ['--admin-token', token, '--policy', 'cost'];
  direct = { workers: a, router: await startRouter(bin, model, children, a.map((w) => w.zmq).join(','), opts) };
  const bridges = [await startBridge(b[0]), await startBridge(b[1])];
  bridged = { workers: b, bridges,
    router: await startRouter(bin, model, children, bridges.map((x) => x.zmq).join(','), opts) };
  direct.view = await waitIndexed(direct.router, token);
  bridged.view = await waitIndexed(bridged.router, token);
});

after(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('a router started after the engines learns their caches from vLLM events and hits as often', async () => {
  const viaDirect = await hitRate(direct.workers, direct.router);
  const viaBridge = await hitRate(bridged.workers, bridged.router);
  console.log(`hit rate: protobuf events ${viaDirect.toFixed(3)}, vLLM events through the bridge ${viaBridge.toFixed(3)}`);
  assert.ok(viaDirect > 0.5, `the direct router hits (${viaDirect})`);
  assert.equal(viaBridge.toFixed(3), viaDirect.toFixed(3));
  // The bridged view holds the re-hashed blocks: as many as the direct view of the same warm-up.
  const blocks = (v) => v.map((w) => w.router.index_blocks).sort((x, y) => x - y);
  assert.deepEqual(blocks(bridged.view), blocks(direct.view));
});

test('outputs through the bridge equal the direct path: greedy text, logprobs, n, streams', async () => {
  for (const extra of [{ logprobs: 2 }, { n: 2, temperature: 0.8, seed: 5 }, { stop: ['x'] }]) {
    const prompt = 'Once upon a time';
    const [a, b] = [await ask(direct.router, prompt, { max_tokens: 6, ...extra }),
      await ask(bridged.router, prompt, { max_tokens: 6, ...extra })];
    assert.deepEqual(b.choices.map((c) => c.text), a.choices.map((c) => c.text), JSON.stringify(extra));
    assert.deepEqual(b.choices.map((c) => c.finish_reason), a.choices.map((c) => c.finish_reason));
    if (extra.logprobs) assert.deepEqual(b.choices[0].logprobs.tokens, a.choices[0].logprobs.tokens);
    assert.equal(b.usage.completion_tokens, a.usage.completion_tokens);
  }
  const stream = await client(bridged.router).chat.completions.create({ model: 'tiny', stream: true,
    messages: [{ role: 'user', content: 'hello' }], max_tokens: 5, temperature: 0,
    stream_options: { include_usage: true } });
  let text = '', usage;
  for await (const chunk of stream) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  const whole = await client(direct.router).chat.completions.create({ model: 'tiny',
    messages: [{ role: 'user', content: 'hello' }], max_tokens: 5, temperature: 0 });
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test('a client that goes away aborts the request on the upstream', async () => {
  const aborts = async () => {
    let n = 0;
    for (const w of bridged.workers) {
      const text = await (await fetch(`${w.base}/metrics`)).text();
      n += Number(/^kvserve_requests_finished_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)/m.exec(text)[1]);
    }
    return n;
  };
  const before = await aborts();
  const response = await fetch(`${bridged.router}/v1/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', prompt: 'Count:', max_tokens: 1000, ignore_eos: true, stream: true }) });
  const reader = response.body.getReader();
  await reader.read();  // the stream has begun on the upstream
  await reader.cancel();  // the client goes away
  for (let i = 0; i < 200 && (await aborts()) === before; i++) await new Promise((res) => setTimeout(res, 50));
  assert.equal(await aborts(), before + 1, 'the upstream counted the request aborted');
});

// The sum over both bridges of a kvserve_upstream_* sample matching `pattern`.
async function bridgeMetric(pattern) {
  let sum = 0;
  for (const x of bridged.bridges) {
    const text = await (await fetch(`${x.metrics}/metrics`)).text();
    for (const m of text.matchAll(new RegExp(`^${pattern} (\\S+)$`, 'gm'))) sum += Number(m[1]);
  }
  return sum;
}

test('what an upstream cannot be asked is refused by name; a bad --url stops the bridge', async () => {
  const refused = await bridgeMetric('kvserve_upstream_requests_total\\{[^}]*result="refused"[^}]*\\}');
  await assert.rejects(client(bridged.router).completions.create({ model: 'tiny', prompt: 'x', max_tokens: 2,
    response_format: { type: 'json_object' } }), (e) => e.status === 400 && /structured outputs/.test(e.message));
  assert.equal(await bridgeMetric('kvserve_upstream_requests_total\\{[^}]*result="refused"[^}]*\\}'), refused + 1);
  await assert.rejects(startAndWait(children, path.join(bin, 'kvserve-upstream'), ['--url', 'https://x:1'],
    /kvserve-upstream ready/), /is not http:\/\/HOST:PORT/);
});

test('each bridge reports its upstream on /metrics and /ready', async () => {
  for (const x of bridged.bridges) assert.equal((await fetch(`${x.metrics}/ready`)).status, 200);
  // The router reads each upstream's /metrics where vLLM serves it (its API port): vllm:* summed.
  const prompt = /^vllm:prompt_tokens_total\{[^}]*\} (\S+)$/m;
  const read = async (url) => (await fetch(`${url}/metrics`)).text();
  let sum = -1, routed = NaN, routerText = '';
  for (let i = 0; i < 40 && routed !== sum; i++) {  // the workers' counters move at their heartbeats
    if (i > 0) await new Promise((res) => setTimeout(res, 100));
    sum = 0;
    for (const w of bridged.workers) sum += Number(prompt.exec(await read(w.base))[1]);
    routerText = await read(bridged.router);
    routed = Number(prompt.exec(routerText)?.[1]);
  }
  assert.ok(sum > 0, routerText);
  assert.equal(routed, sum);
  assert.match(routerText, /kvserve_router_vllm_metrics_sources\{result="read"\} 2\n/);
  assert.equal(await bridgeMetric('kvserve_upstream_ready\\{[^}]*\\}'), 2);
  assert.ok(await bridgeMetric('kvserve_upstream_event_batches_total\\{[^}]*result="applied"[^}]*\\}') > 0);
  assert.ok(await bridgeMetric('kvserve_upstream_indexed_blocks\\{[^}]*\\}') >= 16);
  assert.ok(await bridgeMetric('kvserve_upstream_requests_total\\{[^}]*result="sent"[^}]*\\}') >= 8);
  assert.equal(await bridgeMetric('kvserve_upstream_requests_in_flight\\{[^}]*\\}'), 0);
  assert.equal(await bridgeMetric('kvserve_upstream_blocks_skipped_total\\{[^}]*\\}'), 0);
  assert.ok(await bridgeMetric('kvserve_upstream_scrapes_total\\{[^}]*result="ok"[^}]*\\}') > 0);
});

// A data-parallel pod publishes rank r's events (and answers its replays) at the ports + r, and
// an engine may connect its publisher out, to a bridge that binds. Two workers stand for two
// ranks (each connects out: a tcp endpoint without a wildcard, as vLLM's rule); the bridge binds
// both event ports and its view holds both ranks' blocks.
test('data-parallel ranks at port + r, read through bound event sockets', async () => {
  const [events, replay] = [await freeRange(2), await freeRange(2)];
  const ranks = [];
  for (let r = 0; r < 2; r++) {
    ranks.push(await launchWorker(`dp${r}`, { port: await freePort(), events: await freePort(),
      metrics: await freePort(), http: await freePort(), replay: replay + r }, `tcp://127.0.0.1:${events + r}`));
  }
  const bridge = await startBridge({ base: ranks[0].base, pub: `tcp://127.0.0.1:${events}`,
    replay: `tcp://127.0.0.1:${replay}` }, ['--kv-events-bind', '--data-parallel-size', '2']);
  const indexed = async () => {
    const text = await (await fetch(`${bridge.metrics}/metrics`)).text();
    return Number(/^kvserve_upstream_indexed_blocks\{[^}]*\} (\S+)$/m.exec(text)?.[1] ?? 0);
  };
  const settle = async (above) => {
    let n = 0;
    for (let i = 0; i < 200 && (n = await indexed()) <= above; i++) await new Promise((res) => setTimeout(res, 25));
    return n;
  };
  // A publisher that connects out drops what it publishes before its connection is up (ZeroMQ's
  // PUB, as vLLM's): a second request's batch (new blocks: another family) shows the gap, and
  // the replay brings the first.
  const warm = async (r, f) => {
    await ask(ranks[r].base, `${family(f)} rank ${r}`);
    await new Promise((res) => setTimeout(res, 300));
    await ask(ranks[r].base, `${family(f + 10)} rank ${r}`);
  };
  await warm(0, 5);
  const first = await settle(0);
  assert.ok(first >= 8, `rank 0's blocks: ${first}`);
  await warm(1, 6);
  assert.ok(await settle(first) >= first + 8, 'rank 1\'s blocks are not in the bridge\'s view');
  // An ipc endpoint has no port to shift: refused by name.
  await assert.rejects(startAndWait(children, path.join(bin, 'kvserve-upstream'), ['--url', ranks[0].base,
    '--kv-events-endpoint', `ipc://${tmp}/x.sock`, '--data-parallel-size', '2', '--port', '0',
    '--events-port', '0', '--metrics-port', '0'], /kvserve-upstream ready/), /needs tcp:\/\/HOST:PORT/);
});

// Pod churn. A killed upstream: what the router sends it never reaches it, so the bridge refuses
// it as never run and the router places it on the other upstream (no request fails), and the
// bridge leaves the eligible set at once. Restarted on the same ports: a new process (its
// process_start_time_seconds), whose old blocks leave the router's view before it is eligible.
test('an upstream killed and restarted: no request fails and its old cache is forgotten', async () => {
  const token = 'admin-token';
  const w0 = bridged.workers[0];
  const name = bridged.bridges[0].zmq;  // the router names a worker by its address
  const view = async () => {
    const r = await fetch(`${bridged.router}/admin/workers`, { headers: { authorization: `Bearer ${token}` } });
    const all = (await r.json()).workers;
    const w = all.find((x) => x.name === name);
    assert.ok(w, `${name} not in ${JSON.stringify(all.map((x) => x.name))}`);
    return w;
  };
  assert.ok((await view()).router.index_blocks >= 8);
  w0.child.kill('SIGKILL');
  await new Promise((res) => w0.child.once('exit', res));
  // Ask until the router has placed a request on the killed upstream (it spreads load, but the
  // families may all be cached on the other): none fails.
  const unreached = () => bridgeMetric('kvserve_upstream_requests_total\\{[^}]*result="unreached"[^}]*\\}');
  const failed = [];
  for (let round = 0; round < 8 && (await unreached()) === 0; round++) {
    const asked = await Promise.allSettled(Array.from({ length: 8 },
      (_, i) => ask(bridged.router, `${family(i % 4)} churn ${round} ${i}`)));
    failed.push(...asked.filter((r) => r.status === 'rejected').map((r) => r.reason.message));
  }
  assert.deepEqual(failed, []);
  assert.ok((await unreached()) >= 1, 'no request was placed on the killed upstream');
  // The bridge's heartbeat travels on its own socket and may reach the router after the refused
  // request's reply: it is out of the eligible set within a heartbeat, well before the 2.3 s a
  // failed scrape would take.
  const since = Date.now();
  let out;
  while ((out = await view()).eligible && Date.now() - since < 1500) await new Promise((res) => setTimeout(res, 10));
  assert.equal(out.eligible, false, JSON.stringify(out));
  assert.ok((await bridgeMetric('kvserve_upstream_ready\\{[^}]*\\}')) <= 1);
  const restarts = await bridgeMetric('kvserve_upstream_restarts_total\\{[^}]*\\}');
  bridged.workers[0] = await launchWorker(w0.tag, w0.ports);
  let seen;
  for (let i = 0; i < 200 && !(seen = await view()).eligible; i++) await new Promise((res) => setTimeout(res, 25));
  assert.ok(seen.eligible, JSON.stringify(seen));
  assert.equal(seen.router.index_blocks, 0, 'the restarted upstream\'s old blocks are still indexed');
  assert.equal(await bridgeMetric('kvserve_upstream_restarts_total\\{[^}]*\\}'), restarts + 1);
  const r = await ask(bridged.router, `${family(0)} after the restart`);
  assert.equal(r.choices.length, 1);
});
