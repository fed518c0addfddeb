// A kvserve worker's vLLM-format KV events (--kv-events-config, --kv-events-encoding) as a
// consumer written for vLLM reads them: ZeroMQ from the `zeromq` npm package, msgpack decoded by
// `@msgpack/msgpack` (an independent decoder), every field checked against a table written from
// vLLM's vllm/distributed/kv_events.py (tagged arrays up to 0.23, maps tagged by "type" from 0.24); the
// stored blocks' token ids are the prompt's, chained by parent hash; a consumer that joins late
// sees the gap, replays what it missed and converges on the live consumer's cache; SIGTERM ends
// in AllBlocksCleared. (A consumer that binds, llm-d's way, is in vllm_event_publisher_test.)
//
//   node vllm_kv_events_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { decode } from '@msgpack/msgpack';
import * as zmq from 'zeromq';

import { freePort, makeModel, retryOnPortClash, startAndWait, startRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-vllm-events-'));
const model = path.join(tmp, 'tiny');
const children = [];
const sockets = [];
const BLOCK = 16;

after(() => {
  for (const s of sockets) s.close();
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});

// vLLM's definitions (kv_events.py): each event's fields in order, with a check of each value.
const isInt = (v) => typeof v === 'number' ? Number.isInteger(v) && v >= 0 : typeof v === 'bigint' && v >= 0n;
const isIntList = (v) => Array.isArray(v) && v.every(isInt);
const FIELDS = {
  BlockStored: [['block_hashes', isIntList], ['parent_block_hash', (v) => v === null || isInt(v)],
    ['token_ids', isIntList], ['block_size', (v) => v === BLOCK], ['lora_id', (v) => v === null],
    ['medium', (v) => v === 'GPU' || v === 'CPU'], ['lora_name', (v) => v === null]],
  BlockRemoved: [['block_hashes', isIntList], ['medium', (v) => v === 'GPU' || v === 'CPU']],
  AllBlocksCleared: [],
};
// Arrays up to vLLM 0.23 carry the same fields in the same order (lora_name since its PR #27577).
const ARRAY_FIELDS = FIELDS;

// One payload as a list of {type, ...fields}, every field checked.
function readBatch(payload, encoding) {
  const batch = decode(payload, { useBigInt64: true });
  assert.ok(Array.isArray(batch) && batch.length === 3, 'a batch is [ts, events, data_parallel_rank]');
  const [ts, events, rank] = batch;
  assert.equal(typeof ts, 'number');
  assert.ok(Math.abs(ts - Date.now() / 1000) < 600, 'ts is Unix seconds');
  assert.equal(Number(rank), 0);
  return events.map((e) => {
    if (encoding === 'map') {
      assert.ok(e && !Array.isArray(e) && typeof e === 'object', 'a map event');
      const table = FIELDS[e.type];
      assert.ok(table, `event type ${e.type}`);
      assert.deepEqual(Object.keys(e), ['type', ...table.map(([k]) => k)]);
      for (const [k, ok] of table) assert.ok(ok(e[k]), `${e.type}.${k} = ${e[k]}`);
      return e;
    }
    assert.ok(Array.isArray(e), 'an array event');
    const table = ARRAY_FIELDS[e[0]];
    assert.ok(table, `event tag ${e[0]}`);
    assert.equal(e.length, 1 + table.length, `${e[0]} has ${table.length} fields`);
    const out = { type: e[0] };
    table.forEach(([k, ok], i) => {
      assert.ok(ok(e[i + 1]), `${e[0]}.${k} = ${e[i + 1]}`);
      out[k] = e[i + 1];
    });
    return out;
  });
}

// A consumer's view: hash -> {parent, tokens, media}; cleared on AllBlocksCleared.
function apply(cache, events) {
  for (const e of events) {
    if (e.type === 'AllBlocksCleared') {
      cache.clear();
    } else if (e.type === 'BlockStored') {
      assert.equal(e.token_ids.length, e.block_hashes.length * BLOCK);
      let parent = e.parent_block_hash === null ? null : BigInt(e.parent_block_hash);
      e.block_hashes.forEach((h, i) => {
        const key = BigInt(h);
        const entry = cache.get(key) ?? { parent, tokens: e.token_ids.slice(i * BLOCK, (i + 1) * BLOCK).map(Number),
          media: new Set() };
        entry.media.add(e.medium);
        cache.set(key, entry);
        parent = key;
      });
    } else {
      for (const h of e.block_hashes) cache.get(BigInt(h))?.media.delete(e.medium);
      for (const [k, v] of cache) if (v.media.size === 0) cache.delete(k);
    }
  }
}

const seqOf = (frame) => frame.readBigInt64BE(0);

// Batches from `sub` for `ms` milliseconds. A receive still waiting at the end is kept for the
// next call (a socket takes one receive at a time).
const waiting = new Map();
async function collect(sub, into, encoding, ms) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (!waiting.has(sub)) waiting.set(sub, sub.receive());
    const got = await Promise.race([waiting.get(sub), new Promise((r) => setTimeout(() => r(null), until - Date.now()))]);
    if (!got) break;
    waiting.delete(sub);
    const [topic, seq, payload] = got;
    assert.equal(topic.toString(), 'kv-events');
    into.push({ seq: seqOf(seq), events: readBatch(payload, encoding) });
  }
}

async function replay(endpoint, from, encoding) {
  const dealer = new zmq.Dealer({ receiveTimeout: 5000 });
  sockets.push(dealer);
  dealer.connect(endpoint);
  const start = Buffer.alloc(8);
  start.writeBigInt64BE(BigInt(from));
  await dealer.send([Buffer.alloc(0), start]);
  const out = [];
  for (;;) {
    const [delim, seq, payload] = await dealer.receive();
    assert.equal(delim.length, 0);
    if (seqOf(seq) === -1n) {
      assert.equal(payload.length, 0, 'the end marker has an empty payload');
      return out;
    }
    out.push({ seq: seqOf(seq), events: readBatch(payload, encoding) });
  }
}

async function chat(base, content) {
  const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content }], max_tokens: 4, temperature: 0 }) });
  assert.equal(r.status, 200, await r.clone().text());
  const t = await fetch(`${base}/tokenize`, { method: 'POST',
    body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content }] }) });
  return (await t.json()).tokens;
}

// The prompt's full blocks (all but a last token) form a chain from a first block in `cache`.
function assertPromptCached(cache, prompt) {
  let parent = null;
  const blocks = Math.floor((prompt.length - 1) / BLOCK);
  assert.ok(blocks >= 2, 'the prompt spans blocks');
  for (let i = 0; i < blocks; i++) {
    const want = prompt.slice(i * BLOCK, (i + 1) * BLOCK);
    const hit = [...cache].find(([, v]) => v.parent === parent && v.tokens.join() === want.join());
    assert.ok(hit, `prompt block ${i} with its parent`);
    parent = hit[0];
  }
}

for (const encoding of ['map', 'array']) {
  test(`vLLM-format events, ${encoding} encoding: fields, tokens, replay, all-cleared`, async () => {
    if (!fs.existsSync(model)) makeModel(bin, tokenizerDir, model);
    // ipc:// is bound by the worker (vLLM's rule) and stays on this machine.
    const pub = `ipc://${tmp}/${encoding}-events.sock`;
    let rep, port, events, metrics, worker;
    await retryOnPortClash(async () => {
      [port, events, rep, metrics] = [await freePort(), await freePort(), await freePort(), await freePort()];
      const config = { enable_kv_cache_events: true, publisher: 'zmq', endpoint: pub,
        replay_endpoint: `tcp://127.0.0.1:${rep}`, topic: 'kv-events', buffer_steps: 1000 };
      worker = await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1',
        '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
        '--max-model-len', '1024', '--num-blocks', '256', '--block-size', String(BLOCK),
        '--kv-events-config', JSON.stringify(config), '--kv-events-encoding', encoding], /kvserve-worker ready/);
    });
    const subscribe = () => {
      const sub = new zmq.Subscriber();
      sockets.push(sub);
      sub.connect(pub);
      sub.subscribe('kv-events');
      return sub;
    };
    const live = subscribe();
    const base = await startRouter(bin, model, children, `127.0.0.1:${port}:${events}`);
    const seen = [];
    const prompts = [];
    const shared = 'The paged KV cache keeps every block of a long shared system prompt for the next request. ';
    // A subscription takes a moment to reach the publisher: requests (each new from its first
    // block) until batches arrive; the earlier ones come from the replay below.
    for (let i = 0; i < 20 && seen.length === 0; i++) {
      prompts.push(await chat(base, `Question ${i}. ${shared.repeat(3)} Which block is next?`));
      await collect(live, seen, encoding, 300);
    }
    prompts.push(await chat(base, `Last question. ${shared.repeat(3)} Which one is free?`));
    await collect(live, seen, encoding, 1000);
    assert.ok(seen.length > 1, 'the live consumer got batches');
    for (let i = 1; i < seen.length; i++) assert.equal(seen[i].seq, seen[i - 1].seq + 1n, 'consecutive sequence numbers');

    // A consumer that joins now: its first batch is past 0, so it replays what it missed.
    const late = subscribe();
    const lateSeen = [];
    for (let i = 0; i < 20 && lateSeen.length === 0; i++) {
      prompts.push(await chat(base, `Request ${i} after the late consumer joined. ${shared.repeat(2)}`));
      await collect(late, lateSeen, encoding, 300);
    }
    await collect(late, lateSeen, encoding, 500);
    await collect(live, seen, encoding, 500);
    assert.ok(lateSeen.length > 0 && lateSeen[0].seq > 0n, 'the late consumer sees a gap');
    const replayed = await replay(`tcp://127.0.0.1:${rep}`, 0, encoding);
    assert.equal(replayed[0].seq, 0n);
    assert.equal(replayed[0].events[0].type, 'AllBlocksCleared', 'a fresh worker starts by clearing');
    assert.equal(replayed.at(-1).seq, seen.at(-1).seq, 'the replay reaches the newest batch');
    assert.equal(lateSeen.at(-1).seq, seen.at(-1).seq);
    // Each consumer: the replayed batches before its first live one, then its live ones.
    const state = (live) => {
      const cache = new Map();
      apply(cache, replayed.filter((b) => b.seq < live[0].seq).concat(live).flatMap((b) => b.events));
      return cache;
    };
    const lateCache = state(lateSeen);
    assert.ok(lateCache.size > 0);
    assert.deepEqual([...lateCache.keys()].sort(), [...state(seen).keys()].sort(), 'the late consumer converged');
    for (const p of prompts) assertPromptCached(lateCache, p);

    // The worker counts what it published (its heartbeat refreshes the metrics).
    await new Promise((r) => setTimeout(r, 600));
    const scraped = await (await fetch(`http://127.0.0.1:${metrics}/metrics`)).text();
    const count = (result) => Number(scraped.match(new RegExp(
      `kvserve_vllm_kv_event_batches_total\\{[^}]*result="${result}"[^}]*\\} (\\S+)`))?.[1]);
    assert.ok(count('published') >= Number(seen.at(-1).seq) + 1, `published: ${count('published')}`);
    assert.equal(count('dropped'), 0);

    // SIGTERM: the worker drains and clears.
    const tail = [];
    worker.kill('SIGTERM');
    await collect(live, tail, encoding, 3000);
    assert.ok(tail.some((b) => b.events.some((e) => e.type === 'AllBlocksCleared')), 'AllBlocksCleared at exit');
  });
}
