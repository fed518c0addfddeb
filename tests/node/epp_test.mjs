// kvserve-router --epp-port: the Gateway API Inference Extension's endpoint-picker protocol
// (v1.0.0) over Envoy's ext_proc v3, driven by a gRPC client (@grpc/grpc-js) that writes and
// reads the messages by the field numbers of Envoy's published API (lib/protowire.mjs), not with
// kvserve's .proto: it sends what Envoy sends (protocol_config, request headers, the body in
// chunks, the subset hint in metadata_context, the response's headers) and checks what a
// gateway needs back: the x-gateway-destination-endpoint header and envoy.lb dynamic metadata
// naming a pod's OpenAI endpoint (the pick, then fallbacks), the body streamed back whole, 503
// with no eligible pod, 429 when shedding, 400 for a body that cannot be read, and the gRPC
// health services. The picked endpoints are real kvserve workers with --openai-port, and the
// requests are then sent to them as Envoy would.
//
//   node epp_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import grpc from '@grpc/grpc-js';

import { MODE, REQ, RESP, body, completion, destination, headers, immediate, metadata, open, pick, post,
  protocolConfig } from './lib/ext_proc_client.mjs';
import { freePort, makeModel, retryOnPortClash, startAndWait } from './lib/harness.mjs';
import { decode, encode, field, str } from './lib/protowire.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-epp-'));
const model = path.join(tmp, 'tiny');
const children = [];
const workers = [];  // { http: '127.0.0.1:PORT', zmq: 'host:port:events' }

// Sends the request where the picker said (as Envoy would), then tells the picker the response
// came (its headers, with the served endpoint) and closes the stream.
async function serve(s, endpoint, text, p = '/v1/completions') {
  const r = await fetch(`http://${endpoint}${p}`, { method: 'POST', body: text, headers: { 'content-type': 'application/json' } });
  const json = await r.json();
  s.send([[REQ.responseHeaders, headers({ ':status': String(r.status) }, false)],
    [REQ.metadata, metadata({ 'envoy.lb': { 'x-gateway-destination-endpoint-served': endpoint } })]]);
  assert.ok((await s.next()).has(RESP.responseHeaders));
  s.send([[REQ.responseBody, body(JSON.stringify(json), true)]]);
  assert.ok((await s.next()).has(RESP.responseBody));
  s.end();
  return json;
}

function startWorker() {
  return retryOnPortClash(async () => {
    const [port, events, metrics, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
    await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1',
      '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
      '--openai-port', String(http), '--max-model-len', '1024', '--num-blocks', '256'], /kvserve-worker ready/);
    return { http: `127.0.0.1:${http}`, zmq: `127.0.0.1:${port}:${events}` };
  });
}

// A router with --epp-port; resolves with its picker's port once both workers are heard (and
// the process, with `withChild`).
function startPicker(extra = [], withChild = false) {
  return retryOnPortClash(async () => {
    const [http, epp] = [await freePort(), await freePort()];
    const child = await startAndWait(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1',
      '--port', String(http), '--workers', workers.map((w) => w.zmq).join(','), '--max-model-len', '1024',
      '--epp-port', String(epp), ...extra], /kvserve-router ready/);
    for (let i = 0; i < 200 && (await fetch(`http://127.0.0.1:${http}/ready`)).status !== 200; i++) {
      await new Promise((res) => setTimeout(res, 50));
    }
    await new Promise((res) => setTimeout(res, 600));  // both workers' heartbeats (every 250 ms)
    return withChild ? { epp, child } : epp;
  });
}

let epp;
before(async () => {
  makeModel(bin, tokenizerDir, model);
  workers.push(await startWorker(), await startWorker());
  epp = await startPicker();
});

after(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('FULL_DUPLEX_STREAMED: the pick and its fallbacks in the header and envoy.lb, the body back whole', async () => {
  const text = completion('The quick brown fox');
  const { s, endpoints } = await pick(epp, text);
  assert.deepEqual([...endpoints].sort(), workers.map((w) => w.http).sort(), 'the pick, then the other pod');
  const out = await serve(s, endpoints[0], text);
  assert.equal(out.usage.completion_tokens, 4);
});

test('the pick follows the cache: each shared long prefix goes back to the pod that served it', async () => {
  // Two long prefixes, each served first on its own pod (the second one steered by the subset
  // hint), then questions on both, alternating, with no hint.
  const prefixes = ['You are a careful assistant. '.repeat(40), 'Summarise the following log. '.repeat(40)];
  const home = [];
  for (const [i, prefix] of prefixes.entries()) {
    const text = completion(`${prefix} Question one?`, 2);
    const meta = i === 0 ? undefined
      : { 'envoy.lb.subset_hint': { 'x-gateway-destination-endpoint-subset': workers.map((w) => w.http).filter((e) => e !== home[0]) } };
    const first = await pick(epp, text, { meta });
    home.push(first.endpoints[0]);
    await serve(first.s, first.endpoints[0], text);
  }
  assert.notEqual(home[0], home[1]);
  await new Promise((res) => setTimeout(res, 500));  // their KV events reach the router
  for (const q of ['two', 'three', 'four']) {
    for (const [i, prefix] of prefixes.entries()) {
      const text = completion(`${prefix} Question ${q}?`, 2);
      const b = await pick(epp, text);
      assert.equal(b.endpoints[0], home[i], `prefix ${i}, question ${q}, goes where the prefix is cached`);
      await serve(b.s, b.endpoints[0], text);
    }
  }
});

test('the subset hint: only its endpoints, as a list or a comma string; none eligible is a 503', async () => {
  for (const w of workers) {
    for (const hint of [[w.http], `${w.http}`]) {
      const text = completion('Subset me');
      const { s, endpoints } = await pick(epp, text,
        { meta: { 'envoy.lb.subset_hint': { 'x-gateway-destination-endpoint-subset': hint } } });
      assert.deepEqual(endpoints, [w.http]);
      await serve(s, endpoints[0], text);
    }
  }
  const { s, refused } = await pick(epp, completion('Nowhere'),
    { meta: { 'envoy.lb.subset_hint': { 'x-gateway-destination-endpoint-subset': ['127.0.0.9:1'] } } });
  assert.equal(refused.status, 503);
  assert.equal(refused.body.error.type, 'service_unavailable');
  s.end();
  const empty = await pick(epp, completion('Nowhere'), { meta: { 'envoy.lb.subset_hint': { 'x-gateway-destination-endpoint-subset': [] } } });
  assert.equal(empty.refused.status, 503, 'an empty subset leaves no endpoint');
  empty.s.end();
});

test('BUFFERED: headers answered at once, the endpoint set with the body\'s answer', async () => {
  const s = open(epp);
  const text = completion('Buffered body');
  s.send([[REQ.protocolConfig, protocolConfig(MODE.BUFFERED)], [REQ.requestHeaders, headers(post('/v1/completions'))]]);
  const h = await s.next();
  assert.ok(h.has(RESP.requestHeaders) && !h.has(RESP.dynamicMetadata), 'a plain CONTINUE');
  s.send([[REQ.requestBody, body(text, true)]]);
  const d = destination(await s.next(), RESP.requestBody);
  assert.equal(d.header, d.metadata);
  assert.ok(workers.some((w) => w.http === d.header.split(',')[0]));
  await serve(s, d.header.split(',')[0], text);
});

test('a request with no body (GET /v1/models) is picked on its headers', async () => {
  const s = open(epp);
  s.send([[REQ.protocolConfig, protocolConfig(MODE.FULL_DUPLEX_STREAMED)],
    [REQ.requestHeaders, headers({ ':method': 'GET', ':path': '/v1/models' }, true)]]);
  const d = destination(await s.next(), RESP.requestHeaders);
  assert.ok(workers.some((w) => w.http === d.header.split(',')[0]));
  const models = await (await fetch(`http://${d.header.split(',')[0]}/v1/models`)).json();
  assert.equal(models.data[0].id, 'tiny');
  s.end();
});

test('a body the pods cannot take is a 400 naming what is wrong; unserved-here fields are not refused', async () => {
  for (const [p, text, want] of [
    ['/v1/chat/completions', JSON.stringify({ model: 'tiny', messages: 'nope' }), /messages/],
    ['/v1/completions', '{"model": "tiny", "prompt": ', /JSON object/],
  ]) {
    const { s, refused } = await pick(epp, text, { path: p });
    assert.equal(refused.status, 400, text);
    assert.match(refused.body.error.message, want);
    s.end();
  }
  // Parameters kvserve's router refuses (beam search, a custom chat template, documents) are the
  // pod's to judge: the request is picked.
  const text = JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2,
    use_beam_search: true, best_of: 3, chat_template: '{{ messages[0].content }}', documents: [{ text: 'x' }] });
  const { s, endpoints } = await pick(epp, text, { path: '/v1/chat/completions' });
  assert.ok(endpoints.length >= 1);
  s.end();
});

test('a body mode that cannot carry a pick ends the stream with FAILED_PRECONDITION naming it', async () => {
  const s = open(epp);
  s.send([[REQ.protocolConfig, protocolConfig(MODE.STREAMED)], [REQ.requestHeaders, headers(post('/v1/completions'))]]);
  await assert.rejects(s.next(), (e) => e.code === grpc.status.FAILED_PRECONDITION && /STREAMED/.test(e.details));
  s.end();
});

test('shedding: past the pods\' in-flight limit and an empty queue, a 429', async () => {
  const shedding = await startPicker(['--max-inflight-per-worker', '1', '--max-queued-requests', '0']);
  const held = [];
  for (let i = 0; i < 2; i++) held.push(await pick(shedding, completion(`hold ${i}`)));
  assert.deepEqual(held.map((h) => h.endpoints[0]).sort(), workers.map((w) => w.http).sort(), 'one on each pod');
  const { s, refused } = await pick(shedding, completion('one too many'));
  assert.equal(refused.status, 429);
  assert.equal(refused.body.error.type, 'rate_limit_error');
  s.end();
  held[0].s.end();  // the stream's end releases its pick
  await new Promise((res) => setTimeout(res, 300));
  const again = await pick(shedding, completion('room again'));
  assert.equal(again.endpoints[0], held[0].endpoints[0]);
  again.s.end();
  held[1].s.end();
});

test('gRPC health: liveness, readiness and the ext_proc service are SERVING', async () => {
  const client = new grpc.Client(`127.0.0.1:${epp}`, grpc.credentials.createInsecure());
  const check = (service) => new Promise((resolve, reject) => client.makeUnaryRequest('/grpc.health.v1.Health/Check',
    (b) => b, (b) => b, encode([[1, str(service)]]), (e, r) => (e ? reject(e) : resolve(Number(field(decode(r), 1) ?? 0n)))));
  for (const service of ['', 'liveness', 'readiness', 'envoy.service.ext_proc.v3.ExternalProcessor']) {
    assert.equal(await check(service), 1, `${service || 'the server'} SERVING`);
  }
  await assert.rejects(check('nope'), (e) => e.code === grpc.status.NOT_FOUND);
  client.close();
});

test('SIGTERM: health turns NOT_SERVING at once, an open stream still ends its exchange, then exit 0', async () => {
  const { epp: port, child } = await startPicker(['--shutdown-timeout-seconds', '20'], true);
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const statuses = [];
  const watch = client.makeServerStreamRequest('/grpc.health.v1.Health/Watch', (b) => b, (b) => b,
    encode([[1, str('readiness')]]));
  watch.on('data', (b) => statuses.push(Number(field(decode(b), 1) ?? 0n)));
  watch.on('error', () => {});
  const text = completion('Finish me after SIGTERM');
  const { s, endpoints } = await pick(port, text);
  for (let i = 0; i < 100 && !statuses.includes(1); i++) await new Promise((res) => setTimeout(res, 20));
  assert.deepEqual(statuses, [1], 'readiness SERVING before');
  const exited = new Promise((res) => child.on('exit', (code) => res(code)));
  child.kill('SIGTERM');
  for (let i = 0; i < 100 && !statuses.includes(2); i++) await new Promise((res) => setTimeout(res, 20));
  assert.equal(statuses.at(-1), 2, 'readiness NOT_SERVING after SIGTERM');
  const out = await serve(s, endpoints[0], text);  // the stream open before SIGTERM ends its exchange
  assert.equal(out.usage.completion_tokens, 4);
  assert.equal(await exited, 0);
  client.close();
});
