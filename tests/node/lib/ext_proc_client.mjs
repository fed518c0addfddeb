// An ext_proc client as Envoy is one, for kvserve's endpoint picker (epp/): it writes and
// reads envoy.service.ext_proc.v3 messages by the field numbers of Envoy's published API
// (protowire.mjs), not with kvserve's .proto, over @grpc/grpc-js. Used by epp_test.mjs and
// epp_bench.mjs.
//
//   const { s, endpoints } = await pick(port, body);   // FULL_DUPLEX_STREAMED, as gateways run it
//   ... send the request to endpoints[0] ...; s.end();
import assert from 'node:assert/strict';
import grpc from '@grpc/grpc-js';

import { bool, bytes, decode, encode, field, msg, readStruct, str, structOf, varint } from './protowire.mjs';

// Envoy's field numbers (envoy/service/ext_proc/v3/external_processor.proto, Envoy 1.36).
export const REQ = { requestHeaders: 2, responseHeaders: 3, requestBody: 4, responseBody: 5, metadata: 8, protocolConfig: 11 };
export const RESP = { requestHeaders: 1, responseHeaders: 2, requestBody: 3, responseBody: 4, immediate: 7, dynamicMetadata: 8 };
export const MODE = { NONE: 0, STREAMED: 1, BUFFERED: 2, FULL_DUPLEX_STREAMED: 4 };
const PROCESS = '/envoy.service.ext_proc.v3.ExternalProcessor/Process';

// HttpHeaders { HeaderMap headers = 1 { repeated HeaderValue headers = 1 { key = 1, raw_value = 3 } }, end_of_stream = 3 }
export const headers = (pairs, eos = false) => msg([[1, msg(Object.entries(pairs).map(([k, v]) =>
  [1, msg([[1, str(k)], [3, bytes(Buffer.from(v))]])]))], [3, bool(eos)]]);
export const body = (text, eos) => msg([[1, bytes(Buffer.from(text))], [2, bool(eos)]]);
export const protocolConfig = (req, resp = MODE.NONE) => msg([[1, varint(req)], [2, varint(resp)]]);
// config.core.v3.Metadata { map<string, Struct> filter_metadata = 1 }
export const metadata = (ns) => msg(Object.entries(ns).map(([k, v]) => [1, msg([[1, str(k)], [2, structOf(v)]])]));

// One ext_proc stream, as Envoy opens it per HTTP request: on a connection of its own, or on
// `shared` (a grpc.Client), as Envoy multiplexes its streams on one.
export function open(port, shared = null) {
  const client = shared ?? new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  const close = () => { if (!shared) client.close(); };
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
    end: () => { call.end(); close(); },
    cancel: () => { call.cancel(); close(); },
  };
}

// A CommonResponse's destination header, clear_route_cache and the response's envoy.lb metadata.
export function destination(resp, oneof) {
  const common = decode(field(decode(field(resp, oneof)), 1));
  const mutation = decode(field(common, 2));
  const set = (mutation.get(1) ?? []).map((o) => decode(field(decode(o), 1)));
  const header = set.find((h) => field(h, 1).toString() === 'x-gateway-destination-endpoint');
  const meta = readStruct(field(resp, RESP.dynamicMetadata));
  return { header: field(header, 3).toString(), clear: field(common, 5) === 1n,
    metadata: meta['envoy.lb']['x-gateway-destination-endpoint'] };
}

// The body chunks a FULL_DUPLEX_STREAMED answer sends back, read until end_of_stream.
export async function streamedBody(s) {
  let text = '';
  for (;;) {
    const r = await s.next();
    const common = decode(field(decode(field(r, RESP.requestBody)), 1));
    const streamed = decode(field(decode(field(common, 3)), 3));
    text += (field(streamed, 1) ?? Buffer.alloc(0)).toString();
    if (field(streamed, 2) === 1n) return text;
  }
}

export function immediate(resp) {
  const im = decode(field(resp, RESP.immediate));
  return { status: Number(field(decode(field(im, 1)), 1)), body: JSON.parse(field(im, 3).toString()) };
}

export const completion = (prompt, maxTokens = 4) => JSON.stringify({ model: 'tiny', prompt, max_tokens: maxTokens, temperature: 0 });
export const post = (p) => ({ ':method': 'POST', ':path': p, 'content-type': 'application/json' });

// Picks in FULL_DUPLEX_STREAMED mode: the endpoints, after checking the body comes back whole.
export async function pick(port, text, { path: p = '/v1/completions', meta, client } = {}) {
  const s = open(port, client);
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

