// Structured outputs end to end through kvserve-router and kvserve-worker with the official
// `openai` client: JSON schemas of the JSON-Schema-Test-Suite (draft 4) sampled at temperature
// 1 from a random-weight model, every finished output parsed and validated with ajv; response_format
// json_object and json_schema (also through the client's zod helper). The model's weights are
// random, so only the constraint makes the text JSON.
//
//   node structured_outputs_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import AjvDraft4 from 'ajv-draft-04';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

import { makeModel, startRouter, startWorkerAndRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const suite = path.join(here, 'node_modules/json-schema-test-suite/tests/draft4');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-structured-'));
const children = [];
let client;
let metricsUrl;
let reasoningClient;  // a second router, with --reasoning-parser qwen3

before(async () => {
  const model = path.join(tmp, 'tiny');
  makeModel(bin, tokenizerDir, model);
  const { base, worker, metrics } = await startWorkerAndRouter(bin, model, children);
  metricsUrl = metrics;
  const reasoningBase = await startRouter(bin, model, children, worker, ['--reasoning-parser', 'qwen3']);
  reasoningClient = new OpenAI({ baseURL: `${reasoningBase}/v1`, apiKey: 'unused', maxRetries: 0 });
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

// Every schema of the suite's draft-4 files: served (every finished sample valid) or refused
// with a 400 that names what is not served. Two samples in compact JSON (the default) and two
// with any whitespace (structured_outputs.disable_any_whitespace false).
test('JSON-Schema-Test-Suite draft 4: every finished sample validates with ajv', async () => {
  const ajv = new AjvDraft4({ strict: false });
  const stats = { served: 0, refused: 0, samples: 0, stopped: 0 };
  const compact = { samples: 0, stopped: 0 };
  const refusals = [];
  for (const file of fs.readdirSync(suite).filter((f) => f.endsWith('.json')).sort()) {
    const groups = JSON.parse(fs.readFileSync(path.join(suite, file), 'utf8'));
    for (const [g, group] of groups.entries()) for (const spaced of [false, true]) {
      const where = `${file} #${g} (${group.description})${spaced ? ', any whitespace' : ''}`;
      let r;
      try {
        r = await client.completions.create({ model: 'tiny', prompt: 'JSON:', max_tokens: 200, temperature: 1,
          n: 2, seed: 11 + g, guided_json: group.schema, structured_outputs: { disable_any_whitespace: !spaced } });
      } catch (e) {
        assert.equal(e.status, 400, `${where}: ${e.message}`);
        assert.equal(e.param, 'guided_json', where);
        assert.match(e.message, /unsupported keyword|does not resolve|another document|no integer|matches nothing/, where);
        if (spaced) stats.refused++;
        refusals.push(`${file}: ${e.message}`);
        continue;
      }
      if (spaced) stats.served++;
      const validate = ajv.compile(group.schema);
      const counts = spaced ? stats : compact;
      for (const c of r.choices) {
        counts.samples++;
        if (c.finish_reason !== 'stop') continue;
        counts.stopped++;
        if (!spaced) assert.ok(!/^\s|[\t\n\r]|  /.test(c.text.replace(/"(?:[^"\\]|\\.)*"/g, '""')), `${where}: not compact: ${c.text}`);
        let value;
        assert.doesNotThrow(() => { value = JSON.parse(c.text); }, `${where}: not JSON: ${c.text}`);
        assert.ok(validate(value), `${where}: ${c.text} fails: ${JSON.stringify(validate.errors)}`);
      }
    }
  }
  console.log(`# draft 4: ${JSON.stringify(stats)}, compact ${JSON.stringify(compact)}`);
  for (const line of [...new Set(refusals)]) console.log(`#   refused ${line}`);
  // (Schemas with unbounded strings, numbers or arrays may run to max_tokens: random weights
  // rarely close a string or end a number. With any whitespace more finish, as a run of 20 blanks
  // leaves nothing but the end to draw. Bounded schemas finish: the next test.)
  assert.ok(stats.served >= 50, `only ${stats.served} schemas served`);
  assert.ok(stats.stopped >= 0.6 * stats.samples, `only ${stats.stopped} of ${stats.samples} finished`);
  assert.ok(compact.stopped >= 0.3 * compact.samples, `only ${compact.stopped} of ${compact.samples} finished, compact`);
});

// Schemas that bound their strings, arrays and numbers: the outputs end with `stop`, well
// within max_tokens, whitespace bounded, and validate.
const bounded = [
  { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 130 },
    id: { type: 'string', format: 'uuid' }, tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 4 } },
  required: ['name', 'age'], additionalProperties: false },
  { type: 'array', items: { type: 'object', properties: { x: { type: 'number', minimum: -5, maximum: 5 },
    ok: { type: 'boolean' }, when: { type: 'string', format: 'date' } }, required: ['x', 'ok', 'when'] }, minItems: 1, maxItems: 3 },
  { $defs: { leaf: { type: 'string', pattern: '^[A-Z][a-z]{1,6}$' } }, type: 'object',
    properties: { kind: { const: 'pair' }, left: { $ref: '#/$defs/leaf' }, right: { anyOf: [{ $ref: '#/$defs/leaf' }, { type: 'null' }] } },
    required: ['kind', 'left', 'right'] },
  { oneOf: [{ type: 'object', properties: { t: { const: 'circle' }, r: { type: 'integer', minimum: 1, maximum: 99 } }, required: ['t', 'r'] },
    { type: 'object', properties: { t: { const: 'square' }, side: { type: 'integer', minimum: 1, maximum: 99 } }, required: ['t', 'side'] }] },
];

test('bounded schemas: samples finish with stop and validate (ajv with formats)', async () => {
  const { default: Ajv2020 } = await import('ajv/dist/2020.js');
  const { default: addFormats } = await import('ajv-formats');
  const ajv = addFormats(new Ajv2020({ strict: false }));
  let samples = 0;
  let tokens = 0;
  for (const [i, schema] of bounded.entries()) {
    const validate = ajv.compile(schema);
    for (const stream of [false, true]) {
      const params = { model: 'tiny', messages: [{ role: 'user', content: 'Answer in JSON.' }], max_tokens: 400,
        temperature: 1, n: 4, seed: 100 + i, response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } } };
      const out = await choicesOf(params, stream);
      for (const c of out) {
        samples++;
        assert.equal(c.finish, 'stop', `schema ${i}: ${c.text}`);
        const value = JSON.parse(c.text);
        assert.ok(validate(value), `schema ${i}: ${c.text}: ${JSON.stringify(validate.errors)}`);
        assert.ok(!/\s{21}/.test(c.text), `schema ${i}: a run of over 20 blanks: ${JSON.stringify(c.text)}`);
        tokens += c.tokens ?? 0;
      }
    }
  }
  assert.equal(samples, bounded.length * 2 * 4);
});

// The choices' texts and finish reasons, streamed or not.
async function choicesOf(params, stream) {
  if (!stream) {
    const r = await client.chat.completions.create(params);
    return r.choices.map((c) => ({ text: c.message.content, finish: c.finish_reason }));
  }
  const out = Array.from({ length: params.n ?? 1 }, () => ({ text: '', finish: null }));
  for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
    for (const c of chunk.choices) {
      out[c.index].text += c.delta?.content ?? '';
      out[c.index].finish = c.finish_reason ?? out[c.index].finish;
    }
  }
  return out;
}

test('response_format json_object, and json_schema through the client\'s zod helper', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Some JSON?' }],
    max_tokens: 200, temperature: 1, n: 4, seed: 5, response_format: { type: 'json_object' } });
  for (const c of r.choices) {
    if (c.finish_reason !== 'stop') continue;
    const value = JSON.parse(c.message.content);
    assert.ok(value !== null && typeof value === 'object' && !Array.isArray(value), c.message.content);
  }
  const Event = z.object({ name: z.string().max(10), day: z.enum(['mon', 'tue', 'wed']), attendees: z.array(z.string().max(5)).max(3),
    urgent: z.boolean(), priority: z.number().int().min(1).max(5) });
  const parsed = await client.chat.completions.parse({ model: 'tiny', messages: [{ role: 'user', content: 'An event?' }],
    max_tokens: 300, temperature: 1, seed: 8, response_format: zodResponseFormat(Event, 'event') });
  const msg = parsed.choices[0].message;
  assert.equal(parsed.choices[0].finish_reason, 'stop', msg.content);
  assert.deepEqual(Event.parse(msg.parsed), msg.parsed);
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'object', properties: { a: { not: {} } } } } } }),
  (e) => e.status === 400 && e.param === 'response_format.json_schema.schema' && /'not' at #\/properties\/a/.test(e.message));
});

test('the worker counts compiled constraints and masks', async () => {
  const lines = (await (await fetch(metricsUrl)).text()).split('\n');
  const value = (name, result) => {
    const line = lines.find((l) => l.startsWith(`${name}{`) && (!result || l.includes(`result="${result}"`)));
    return Number(line?.split(' ').pop());
  };
  assert.ok(value('kvserve_structured_constraints_total', 'compiled') >= 50);
  assert.ok(value('kvserve_structured_constraints_total', 'cached') >= 1);
  assert.ok(value('kvserve_structured_masks_total', 'computed') > 0);
  assert.ok(value('kvserve_structured_masks_total', 'cached') > 0);
  assert.ok(value('kvserve_structured_mask_seconds_total') > 0);
});

// A recursive GBNF grammar (guided_grammar and structured_outputs.grammar); outputs checked by a
// recursive-descent recognizer written here.
test('GBNF grammars: arithmetic with parentheses', async () => {
  const grammar = String.raw`root ::= expr
expr ::= term ([+*-] term){0,3}
term ::= [0-9]{1,2} | "(" expr ")"`;
  const recognize = (text) => {
    let i = 0;
    const term = () => {
      if (text[i] === '(') { i++; if (!expr() || text[i] !== ')') return false; i++; return true; }
      const m = /^[0-9]{1,2}/.exec(text.slice(i));
      if (!m) return false;
      i += m[0].length;
      return !/[0-9]/.test(text[i] ?? '');
    };
    const expr = () => {
      if (!term()) return false;
      for (let k = 0; k < 3 && /[+*-]/.test(text[i] ?? ''); k++) { i++; if (!term()) return false; }
      return true;
    };
    return expr() && i === text.length;
  };
  let finished = 0;
  for (const [k, field] of [['guided_grammar', (g) => ({ guided_grammar: g })], ['structured_outputs', (g) => ({ structured_outputs: { grammar: g } })]].entries()) {
    const r = await client.completions.create({ model: 'tiny', prompt: 'Math:', max_tokens: 120, temperature: 1, n: 6,
      seed: 21 + k, ...field[1](grammar) });
    for (const c of r.choices) {
      if (c.finish_reason !== 'stop') continue;
      finished++;
      assert.ok(recognize(c.text), `${field[0]}: ${c.text}`);
    }
  }
  assert.ok(finished >= 6, `only ${finished} of 12 finished`);
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', guided_grammar: 'root ::= root "a" | "b"' }),
    (e) => e.status === 400 && e.param === 'guided_grammar' && /left-recursive/.test(e.message));
});

// With --reasoning-parser: reasoning_content in every chat message (null when the output has no
// <think> block), the same split streamed as whole, and a JSON schema still kept by the content.
test('reasoning parser: reasoning_content, streamed and whole, with a constraint', async () => {
  const params = { model: 'tiny', messages: [{ role: 'user', content: 'Think, then answer.' }], max_tokens: 60,
    temperature: 1, n: 4, seed: 17 };
  const whole = await reasoningClient.chat.completions.create(params);
  const streamed = Array.from({ length: 4 }, () => ({ content: '', reasoning: '' }));
  for await (const chunk of await reasoningClient.chat.completions.create({ ...params, stream: true })) {
    for (const c of chunk.choices) {
      streamed[c.index].content += c.delta?.content ?? '';
      streamed[c.index].reasoning += c.delta?.reasoning_content ?? '';
    }
  }
  for (const [i, c] of whole.choices.entries()) {
    assert.ok('reasoning_content' in c.message, JSON.stringify(c.message));
    assert.equal(streamed[i].content, c.message.content);
    assert.equal(streamed[i].reasoning, c.message.reasoning_content ?? '');
  }
  const plain = await client.chat.completions.create({ ...params, n: 1 });
  assert.ok(!('reasoning_content' in plain.choices[0].message), 'no parser, no field');
  const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
  const r = await reasoningClient.chat.completions.create({ ...params, max_tokens: 200,
    response_format: { type: 'json_schema', json_schema: { name: 'ok', schema } } });
  for (const c of r.choices) {
    if (c.finish_reason !== 'stop') continue;
    assert.equal(typeof JSON.parse(c.message.content).ok, 'boolean', JSON.stringify(c.message));
  }
});
