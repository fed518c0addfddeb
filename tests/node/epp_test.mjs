// kvserve-router --epp-port: the Gateway API Inference Extension's endpoint-picker protocol
// (v1.0.0) over Envoy's ext_proc v3, driven by a gRPC client (@grpc/grpc-js) that writes and
// reads the messages by the field numbers of Envoy's published API (protowire.mjs), not with
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

import { freePort, makeModel, retryOnPortClash, startAndWait } from './harness.mjs';
import { bool, bytes, decode, encode, field, msg, readStruct, str, structOf, varint } from './protowire.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-epp-'));
const model = path.join(tmp, 'tiny');
const children = [];
const workers = [];  // { http: '127.0.0.1:PORT', zmq: 'host:port:events' }

// Envoy's field numbers (envoy/service/ext_proc/v3/external_processor.proto, Envoy 1.36).
const REQ = { requestHeaders: 2, responseHeaders: 3, requestBody: 4, responseBody: 5, metadata: 8, protocolConfig: 11 };
const RESP = { requestHeaders: 1, responseHeaders: 2, requestBody: 3, responseBody: 4, immediate: 7, dynamicMetadata: 8 };
const MODE = { NONE: 0, STREAMED: 1, BUFFERED: 2, FULL_DUPLEX_STREAMED: 4 };
const PROCESS = '/envoy.service.ext_proc.v3.ExternalProcessor/Process';

// HttpHeaders { HeaderMap headers = 1 { repeated HeaderValue headers = 1 { key = 1, raw_value = 3 } }, end_of_stream = 3 }
const headers = (pairs, eos = false) => msg([[1, msg(Object.entries(pairs).map(([k, v]) =>
  [1, msg([[1, str(k)], [3, bytes(Buffer.from(v))]])]))], [3, bool(eos)]]);
const body = (text, eos) => msg([[1, bytes(Buffer.from(text))], [2, bool(eos)]]);
const protocolConfig = (req, resp = MODE.NONE) => msg([[1, varint(req)], [2, varint(resp)]]);
// config.core.v3.Metadata { map<string, Struct> filter_metadata = 1 }
const metadata = (ns) => msg(Object.entries(ns).map(([k, v]) => [1, msg([[1, str(k)], [2, structOf(v)]])]));

// One ext_proc stream, as Envoy opens it per HTTP request.
function open(port) {
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const call = client.makeBidiStreamRequest(PROCESS, (b) => b, (b) => b);
  const got = [];
  const waiters = [];
  let ended = null;
  const settle = () => {
    while (waiters.length && (got.length || ended)) waiters.shift()();
  };
  call.on('data', (b) => { got.push(decode(b)); settle(); });
  call.on('error', (e) => { ended = e; settle(); });
  call.on('end', () => { ended = ended ?? 'end'; settle(); });
  return {
    send: (fields) => call.write(encode(fields)),
    next: () => new Promise((resolve, reject) => {
      waiters.push(() => (got.length ? resolve(got.shift()) : reject(ended)));
      settle();
    }),
    end: () => { call.end(); client.close(); },
    cancel: () => { call.cancel(); client.close(); },
  };
}

// A CommonResponse's destination header, clear_route_cache and the response's envoy.lb metadata.
function destination(resp, oneof) {
  const common = decode(field(decode(field(resp, oneof)), 1));
  const mutation = decode(field(common, 2));
  const set = (mutation.get(1) ?? []).map((o) => decode(field(decode(o), 1)));
  const header = set.find((h) => field(h, 1).toString() === 'x-gateway-destination-endpoint');
  const meta = readStruct(field(resp, RESP.dynamicMetadata));
  return { header: field(header, 3).toString(), clear: field(common, 5) === 1n,
    metadata: meta['envoy.lb']['x-gateway-destination-endpoint'] };
}

// The body chunks a FULL_DUPLEX_STREAMED answer sends back, read until end_of_stream.
async function streamedBody(s) {
  let text = '';
  for (;;) {
    const r = await s.next();
    const common = decode(field(decode(field(r, RESP.requestBody)), 1));
    const streamed = decode(field(decode(field(common, 3)), 3));
    text += (field(streamed, 1) ?? Buffer.alloc(0)).toString();
    if (field(streamed, 2) === 1n) return text;
  }
}

function immediate(resp) {
  const im = decode(field(resp, RESP.immediate));
  return { status: Number(field(decode(field(im, 1)), 1)), body: JSON.parse(field(im, 3).toString()) };
}

const completion = (prompt, maxTokens = 4) => JSON.stringify({ model: 'tiny', prompt, max_tokens: maxTokens, temperature: 0 });
const post = (p) => ({ ':method': 'POST', ':path': p, 'content-type': 'application/json' });

// Picks in FULL_DUPLEX_STREAMED mode: the endpoints, after checking the body comes back whole.
async function pick(port, text, { path: p = '/v1/completions', meta } = {}) {
  const s = open(port);
  const first = [[REQ.protocolConfig, protocolConfig(MODE.FULL_DUPLEX_STREAMED)], [REQ.requestHeaders, headers(post(p))]];
  if (meta) first.push([REQ.metadata, metadata(meta)]);
  s.send(first);
  const half = Math.floor(text.length / 2);
  s.send([[REQ.requestBody, body(text.slice(0, half), false)]]);
  s.send([[REQ.requestBody, body(text.slice(half), true)]]);
  const r = await s.next();
  if (r.has(RESP.immediate)) return { s, refused: immediate(r) };
  const d = destination(r, RESP.requestHeaders);
  assert.equal(d.header, d.metadata, 'the header and the metadata name the same endpoints');
  assert.ok(d.clear, 'clear_route_cache');
  assert.equal(await streamedBody(s), text, 'the body comes back whole');
  return { s, endpoints: d.header.split(',') };
}

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

// A router with --epp-port; resolves with its picker's port once both workers are heard.
function startPicker(extra = []) {
  return retryOnPortClash(async () => {
    const [http, epp] = [await freePort(), await freePort()];
    await startAndWait(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1',
      '--port', String(http), '--workers', workers.map((w) => w.zmq).join(','), '--max-model-len', '1024',
      '--epp-port', String(epp), ...extra], /kvserve-router ready/);
    for (let i = 0; i < 200 && (await fetch(`http://127.0.0.1:${http}/ready`)).status !== 200; i++) {
      await new Promise((res) => setTimeout(res, 50));
    }
    await new Promise((res) => setTimeout(res, 600));  // both workers' heartbeats (every 250 ms)
    return epp;
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
