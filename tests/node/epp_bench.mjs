// The endpoint picker's cost per request, over loopback: two kvserve workers (--openai-port) and
// a kvserve-router with --epp-port; picks as a gateway makes them (FULL_DUPLEX_STREAMED: the
// headers, the body in one chunk, the pick in the headers' answer, the body streamed back), each
// stream closed at once (the request is never sent: this measures the picker alone). Beside it,
// in the same run, a gRPC health Check on the same server: the floor of one gRPC round trip.
// All on one HTTP/2 connection, as Envoy multiplexes its streams. Prints p50 / p99 of each, the
// ratio, and picks per second with 16 streams at once.
//
//   node tests/node/epp_bench.mjs BUILD/bin TOKENIZER_DIR [PICKS=1000] [PROMPT_WORDS=300]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import grpc from '@grpc/grpc-js';

import { completion, pick } from './lib/ext_proc_client.mjs';
import { freePort, makeModel, retryOnPortClash, startAndWait } from './lib/harness.mjs';
import { encode, str } from './lib/protowire.mjs';

const [bin, tokenizerDir, picksArg = '1000', wordsArg = '300'] = process.argv.slice(2);
const picks = Number(picksArg), words = Number(wordsArg);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-epp-bench-'));
const model = path.join(tmp, 'tiny');
const children = [];

const quantile = (xs, q) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))];
const ms = (ns) => (ns / 1e6).toFixed(3);
const vocabulary = 'the cache keeps every block a prompt shares with one before it so routing matters'.split(' ');
const prompt = (i) => Array.from({ length: words }, (_, k) => vocabulary[(i * 7 + k * 13) % vocabulary.length]).join(' ') + ` #${i}`;

async function main() {
  makeModel(bin, tokenizerDir, model);
  const workers = [];
  for (let i = 0; i < 2; i++) {
    workers.push(await retryOnPortClash(async () => {
      const [port, events, metrics, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
      await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1',
        '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
        '--openai-port', String(http), '--max-model-len', '2048', '--num-blocks', '512'], /kvserve-worker ready/);
      return `127.0.0.1:${port}:${events}`;
    }));
  }
  const epp = await retryOnPortClash(async () => {
    const [http, port] = [await freePort(), await freePort()];
    await startAndWait(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1',
      '--port', String(http), '--workers', workers.join(','), '--max-model-len', '2048', '--epp-port', String(port)],
    /kvserve-router ready/);
    for (let i = 0; i < 200 && (await fetch(`http://127.0.0.1:${http}/ready`)).status !== 200; i++) {
      await new Promise((res) => setTimeout(res, 50));
    }
    await new Promise((res) => setTimeout(res, 600));
    return port;
  });

  // One HTTP/2 connection for every stream, as Envoy keeps to its ext_proc cluster.
  const client = new grpc.Client(`127.0.0.1:${epp}`, grpc.credentials.createInsecure());
  const timedPick = async (i) => {
    const t0 = process.hrtime.bigint();
    const { s } = await pick(epp, completion(prompt(i), 16), { client });
    const dt = Number(process.hrtime.bigint() - t0);
    s.end();
    return dt;
  };
  for (let i = 0; i < 50; i++) await timedPick(-1 - i);  // warm up
  const pickTimes = [];
  for (let i = 0; i < picks; i++) pickTimes.push(await timedPick(i));

  const check = () => new Promise((resolve, reject) => client.makeUnaryRequest('/grpc.health.v1.Health/Check',
    (b) => b, (b) => b, encode([[1, str('readiness')]]), (e) => (e ? reject(e) : resolve())));
  for (let i = 0; i < 50; i++) await check();
  const checkTimes = [];
  for (let i = 0; i < picks; i++) {
    const t0 = process.hrtime.bigint();
    await check();
    checkTimes.push(Number(process.hrtime.bigint() - t0));
  }

  const t0 = process.hrtime.bigint();
  let next = 0;
  await Promise.all(Array.from({ length: 16 }, async () => {
    while (next < picks) await timedPick(picks + next++);
  }));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  client.close();

  const p50 = quantile(pickTimes, 0.5), p99 = quantile(pickTimes, 0.99);
  const c50 = quantile(checkTimes, 0.5), c99 = quantile(checkTimes, 0.99);
  console.log(`prompt ${words} words (${completion(prompt(0), 16).length} bytes of body), ${picks} picks each`);
  console.log(`pick (one at a time)    p50 ${ms(p50)} ms  p99 ${ms(p99)} ms`);
  console.log(`health Check (floor)    p50 ${ms(c50)} ms  p99 ${ms(c99)} ms`);
  console.log(`pick / Check            p50 ${(p50 / c50).toFixed(2)}x  p99 ${(p99 / c99).toFixed(2)}x`);
  console.log(`16 streams at once      ${(picks / seconds).toFixed(0)} picks/s`);
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
}).finally(() => {
  for (const c of children) c.kill('SIGKILL');
  fs.rmSync(tmp, { recursive: true, force: true });
});
