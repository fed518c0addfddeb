// Compact JSON against any whitespace (docs/STRUCTURED_OUTPUTS.md): the same requests on the
// generated random-weight model at temperature 1, each sent twice, with
// structured_outputs.disable_any_whitespace true (compact: ", " and ": ", kvserve's default) and
// false (up to 20 blanks in each gap, vLLM's default). Three sets: the JSON-Schema-Test-Suite's
// draft-4 schemas (completions, max_tokens 200, n 4), four bounded schemas (chat, max_tokens 400,
// n 4), and a forced tool call (tool_choice "required", max_tokens 48, 16 seeds: LangChain's
// bindTools case). Per set and mode: outputs, the share that finished (`stop` or `tool_calls`),
// and the mean completion tokens of a finished output.
//
//   node tests/bench/json_whitespace.mjs BUILD_BIN_DIR TOKENIZER_DIR > table.md
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { makeModel, startRouter, startWorkerAndRouter } from '../node/lib/harness.mjs';

const [bin, tokenizer] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const suite = path.join(here, '../node/node_modules/json-schema-test-suite/tests/draft4');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-json-ws-'));
const children = [];
const bounded = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 130 },
    tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 4 } }, required: ['name', 'age'], additionalProperties: false },
  { type: 'array', items: { type: 'object', properties: { x: { type: 'number', minimum: -5, maximum: 5 }, ok: { type: 'boolean' } },
    required: ['x', 'ok'] }, minItems: 1, maxItems: 3 },
  { type: 'object', properties: { kind: { const: 'pair' }, left: { type: 'string', pattern: '^[A-Z][a-z]{1,6}$' } },
    required: ['kind', 'left'] },
  { oneOf: [{ type: 'object', properties: { t: { const: 'circle' }, r: { type: 'integer', minimum: 1, maximum: 99 } }, required: ['t', 'r'] },
    { type: 'object', properties: { t: { const: 'square' }, s: { type: 'integer', minimum: 1, maximum: 99 } }, required: ['t', 's'] }] },
];
const toolSets = {
  'now()': [{ type: 'function', function: { name: 'now' } }],
  'get_time(tz: enum)': [{ type: 'function', function: { name: 'get_time', parameters: { type: 'object',
    properties: { tz: { enum: ['UTC', 'CET', 'PST'] } }, required: ['tz'], additionalProperties: false } } }],
  'get_weather(city: string ≤ 12, unit: enum)': [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 },
      unit: { enum: ['celsius', 'fahrenheit'] } }, required: ['city', 'unit'], additionalProperties: false } } }],
};

async function post(base, route, body) {
  const r = await fetch(`${base}/v1/${route}`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body) });
  return [r.status, await r.json()];
}

// [outputs, finished, tokens of the finished] for one body; a 400 (a schema not served) counts
// nothing. With n > 1 the usage covers every choice: tokens are split evenly among them.
async function measure(base, route, body) {
  const [status, r] = await post(base, route, body);
  if (status !== 200) return [0, 0, 0];
  const finished = r.choices.filter((c) => c.finish_reason === 'stop' || c.finish_reason === 'tool_calls');
  const perChoice = r.usage.completion_tokens / r.choices.length;
  return [r.choices.length, finished.length, finished.length ? perChoice * finished.length : 0];
}

// The same token count per choice needs each choice's own length: ask for them one by one.
async function measureEach(base, route, body, n) {
  const total = [0, 0, 0];
  for (let i = 0; i < n; i++) {
    const [outs, fin, toks] = await measure(base, route, { ...body, n: 1, seed: body.seed * 16 + i });
    total[0] += outs; total[1] += fin; total[2] += toks;
  }
  return total;
}

try {
  const model = path.join(tmp, 'model');
  makeModel(bin, tokenizer, model);
  const { base, worker } = await startWorkerAndRouter(bin, model, children);
  const sets = {
    'draft-4 suite (completions, 200 tokens)': fs.readdirSync(suite).filter((f) => f.endsWith('.json')).sort()
      .flatMap((f) => JSON.parse(fs.readFileSync(path.join(suite, f), 'utf8')).map((g, i) => (ws) =>
        measureEach(base, 'completions', { model: 'model', prompt: 'JSON:', max_tokens: 200, temperature: 1, seed: 11 + i,
          guided_json: g.schema, structured_outputs: { disable_any_whitespace: !ws } }, 4))),
    'bounded schemas (chat, 400 tokens)': bounded.map((schema, i) => (ws) =>
      measureEach(base, 'chat/completions', { model: 'model', messages: [{ role: 'user', content: 'Answer in JSON.' }],
        max_tokens: 400, temperature: 1, seed: 100 + i,
        structured_outputs: { json: schema, disable_any_whitespace: !ws } }, 4)),
  };
  console.log('| set | whitespace | outputs | finished | mean tokens of a finished output |');
  console.log('|---|---|---|---|---|');
  for (const [name, runs] of Object.entries(sets)) {
    for (const ws of [false, true]) {
      const total = [0, 0, 0];
      for (const run of runs) {
        const [o, f, t] = await run(ws);
        total[0] += o; total[1] += f; total[2] += t;
      }
      console.log(`| ${name} | ${ws ? 'any (≤ 20 a gap)' : 'compact'} | ${total[0]} | ${total[1]} (${(100 * total[1] / total[0]).toFixed(1)}%) | ${(total[2] / Math.max(1, total[1])).toFixed(1)} |`);
    }
  }
  // Forced tool calls: the server's default decides (the flag), so one router per mode.
  const spaced = await startRouter(bin, model, children, worker, ['--structured-outputs-any-whitespace']);
  for (const [name, tools] of Object.entries(toolSets)) {
    for (const ws of [false, true]) {
      const total = [0, 0, 0];
      for (let seed = 0; seed < 16; seed++) {
        const [o, f, t] = await measure(ws ? spaced : base, 'chat/completions', { model: 'model',
          messages: [{ role: 'user', content: 'What time is it in Paris?' }], tools, tool_choice: 'required',
          max_tokens: 48, temperature: 1, seed });
        total[0] += o; total[1] += f; total[2] += t;
      }
      console.log(`| forced call of ${name}, max_tokens 48, 16 seeds | ${ws ? 'any (≤ 20 a gap)' : 'compact'} | ${total[0]} | ${total[1]} (${(100 * total[1] / total[0]).toFixed(1)}%) | ${(total[2] / Math.max(1, total[1])).toFixed(1)} |`);
    }
  }
} finally {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
}
