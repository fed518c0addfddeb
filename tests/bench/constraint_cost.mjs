// What a structured-outputs constraint costs in decode throughput (docs/PERF.md): a worker and a
// router on the generated model (Llama 3's 128K vocabulary), the same requests with and without
// a JSON schema, at batch 1 (one request at a time) and batch 32 (32 at once), the variants
// interleaved round by round after a warm-up round (the schema compiled, its masks cached as far
// as the warm-up reached). Measured: the worker's mean time per output token (its
// kvserve_time_per_output_token_seconds histogram, decode steps only: no prefill, no HTTP), and
// generated tokens per second of wall time at the client; every request runs 100 tokens.
//
//   node tests/bench/constraint_cost.mjs BUILD_BIN_DIR TOKENIZER_DIR [ROUNDS] > table.md
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { makeModel, startWorkerAndRouter } from '../node/harness.mjs';

const [bin, tokenizer, rounds = '5'] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-constraint-cost-'));
const children = [];
const cleanup = () => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
};
// Records of bounded fields, at least 60 of them: no output can end before max_tokens (100), so
// both variants run every step at the full batch.
const schema = {
  type: 'array',
  minItems: 60,
  items: { type: 'object', properties: { sku: { type: 'string', maxLength: 8 }, qty: { type: 'integer', minimum: 1, maximum: 999 },
    state: { enum: ['new', 'paid', 'shipped'] }, note: { type: 'string', maxLength: 12 } }, required: ['sku', 'qty', 'state'] },
};
try {
  const model = path.join(tmp, 'model');
  makeModel(bin, tokenizer, model);
  const { base, metrics } = await startWorkerAndRouter(bin, model, children);
  const tpot = async () => {  // [sum, count] of the worker's time-per-output-token histogram
    const text = await (await fetch(metrics)).text();
    const get = (name) => Number(text.split('\n').find((l) => l.startsWith(name))?.split(' ').pop() ?? 0);
    return [get('kvserve_time_per_output_token_seconds_sum'), get('kvserve_time_per_output_token_seconds_count'),
      get('kvserve_structured_mask_seconds_total')];
  };
  const post = async (body) => {
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'model', prompt: 'Customer record:', temperature: 1, max_tokens: 200, ...body }) });
    const j = await r.json();
    if (r.status !== 200) throw new Error(JSON.stringify(j));
    return j.usage.completion_tokens;
  };
  // `batch` requests at once; returns [tokens, ms].
  const run = async (batch, extra, round) => {
    const [sum0, count0, mask0] = await tpot();
    const t0 = performance.now();
    const counts = await Promise.all(Array.from({ length: batch }, (_, i) => post({ seed: round * 1000 + i, ...extra })));
    const ms = performance.now() - t0;
    const [sum1, count1, mask1] = await tpot();
    return [counts.reduce((a, b) => a + b, 0), ms, sum1 - sum0, count1 - count0, mask1 - mask0];
  };
  const variants = {
    'free, batch 1': [1, { ignore_eos: true, max_tokens: 100 }],
    'schema, batch 1': [1, { guided_json: schema, max_tokens: 100 }],
    'any text, batch 1': [1, { guided_regex: '[\\s\\S]*', ignore_eos: true, max_tokens: 100 }],
    'free, batch 32': [32, { ignore_eos: true, max_tokens: 100 }],
    'schema, batch 32': [32, { guided_json: schema, max_tokens: 100 }],
    'any text, batch 32': [32, { guided_regex: '[\\s\\S]*', ignore_eos: true, max_tokens: 100 }],
  };
  const results = Object.fromEntries(Object.keys(variants).map((v) => [v, { tokens: 0, ms: 0, tpotSum: 0, tpotCount: 0, maskS: 0 }]));
  for (const [batch, extra] of Object.values(variants)) await run(batch, extra, 999);  // warm-up
  for (let k = 0; k < Number(rounds); k++) {
    for (const [name, [batch, extra]] of Object.entries(variants)) {
      const [tokens, ms, tpotSum, tpotCount, maskS] = await run(batch, extra, k);
      const r = results[name];
      Object.assign(r, { tokens: r.tokens + tokens, ms: r.ms + ms, tpotSum: r.tpotSum + tpotSum,
        tpotCount: r.tpotCount + tpotCount, maskS: r.maskS + maskS });
    }
  }
  const rate = (v) => (results[v].tokens / results[v].ms) * 1000;
  const step = (v) => (results[v].tpotSum / results[v].tpotCount) * 1000;
  console.log(`| variant (${rounds} rounds after a warm-up) | tokens | mean ms per output token (worker) | × free | mask walks, ms per token | tokens/s at the client |`);
  console.log('|---|---|---|---|---|---|');
  for (const v of Object.keys(variants)) {
    const free = step(v.replace(/schema|any text/, 'free'));
    const maskMs = (results[v].maskS * 1000) / results[v].tokens;
    console.log(`| ${v} | ${results[v].tokens} | ${step(v).toFixed(2)} | ${(step(v) / free).toFixed(2)} | ` +
      `${maskMs.toFixed(3)} | ${rate(v).toFixed(0)} |`);
  }
} finally {
  cleanup();
}
