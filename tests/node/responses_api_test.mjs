// OpenAI's Responses API (POST /v1/responses) end to end through kvserve-router and
// kvserve-worker with the official `openai` client: responses.create and responses.stream (whose
// accumulator checks every event's indexes and item ids), the same tokens as the equivalent chat
// completion, function tools (required and named, streamed and not, and their results sent back
// as items), text.format json_schema, logprobs, and the 400s and 404s of what a stateless server
// does not serve. The model's weights are random: only constraints shape its calls.
//
//   node responses_api_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import Ajv from 'ajv';
import OpenAI from 'openai';

import { makeModel, startWorkerAndRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-responses-'));
const children = [];
let client;
let base;

const weather = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', name: 'get_weather', description: 'Weather in a city', parameters: weather, strict: true },
  { type: 'function', name: 'now', parameters: {} },
];
const validate = { get_weather: new Ajv({ strict: false }).compile(weather), now: (a) => Object.keys(a).length === 0 };

before(async () => {
  const model = path.join(tmp, 'tiny');
  makeModel(bin, tokenizerDir, model);
  ({ base } = await startWorkerAndRouter(bin, model, children));
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

// The events of a streamed response through the client's accumulator, and its final response.
async function streamed(params) {
  const stream = client.responses.stream(params);
  const events = [];
  for await (const e of stream) events.push(e);
  return { events, final: await stream.finalResponse() };
}

test('responses.create: the same tokens as the chat completion, usage and status', async () => {
  const params = { model: 'tiny', instructions: 'Be brief.', input: 'Say hello.', max_output_tokens: 12,
    temperature: 0, seed: 3 };
  const r = await client.responses.create(params);
  const chat = await client.chat.completions.create({ model: 'tiny', max_tokens: 12, temperature: 0, seed: 3,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hello.' }] });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.output_text, chat.choices[0].message.content);
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.status, chat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  if (r.status === 'incomplete') assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.instructions, 'Be brief.');
  assert.equal(r.max_output_tokens, 12);
  assert.equal(r.store, false);
  const [message] = r.output;
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.equal(message.content[0].type, 'output_text');
  // Items as input: a developer message is a system one, output_text parts are text.
  const items = await client.responses.create({ ...params, instructions: undefined,
    input: [{ role: 'developer', content: 'Be brief.' }, { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Say hello.' }] }] });
  assert.equal(items.output_text, r.output_text);
});

test('responses.stream: typed events in order, the same text as whole', async () => {
  const params = { model: 'tiny', input: 'Count to three.', max_output_tokens: 16, temperature: 0 };
  const whole = await client.responses.create(params);
  const { events, final } = await streamed(params);
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', final.status === 'incomplete' ? 'response.incomplete' : 'response.completed']);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, whole.output_text);
  assert.equal(final.output_text, whole.output_text);
  assert.deepEqual(final.usage, whole.usage);
});

test('function tools: required and named calls validate, streamed and not, and go back as items', async () => {
  let called = 0;
  for (const [i, tool_choice] of ['required', { type: 'function', name: 'get_weather' }].entries()) {
    const params = { model: 'tiny', input: 'Weather in Paris?', tools, tool_choice, temperature: 1, seed: 5 + i,
      max_output_tokens: 200 };
    for (const stream of [false, true]) {
      const r = stream ? (await streamed(params)).final : await client.responses.create(params);
      if (r.status !== 'completed') continue;
      const calls = r.output.filter((o) => o.type === 'function_call');
      assert.ok(calls.length > 0, JSON.stringify(r.output));
      called++;
      for (const c of calls) {
        assert.match(c.call_id, /^call_/);
        assert.ok(validate[c.name], c.name);
        assert.ok(validate[c.name](JSON.parse(c.arguments)), c.arguments);
        if (typeof tool_choice === 'object') assert.equal(c.name, 'get_weather');
      }
      // The calls and their results back in a second request.
      const next = await client.responses.create({ model: 'tiny', tools, tool_choice: 'none', max_output_tokens: 8,
        input: [{ role: 'user', content: 'Weather in Paris?' }, ...calls,
          ...calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: '{"temp": 21}' }))] });
      assert.equal(next.output.filter((o) => o.type === 'function_call').length, 0);
    }
  }
  assert.ok(called >= 2, `only ${called} of 4 responses finished with calls`);
});

test('text.format json_schema keeps the output to the schema', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false };
  let parsed = 0;
  for (const seed of [1, 2, 3]) {
    const r = await client.responses.create({ model: 'tiny', input: 'Answer in JSON.', temperature: 1, seed,
      max_output_tokens: 60, text: { format: { type: 'json_schema', name: 'ok', schema, strict: true } } });
    assert.deepEqual(r.text.format.schema, schema);
    if (r.status !== 'completed') continue;
    assert.equal(typeof JSON.parse(r.output_text).ok, 'boolean', r.output_text);
    parsed++;
  }
  assert.ok(parsed > 0, 'no seed finished within 60 tokens');
});

test('logprobs with include: one entry per output token, streamed the same', async () => {
  const params = { model: 'tiny', input: 'Hi', max_output_tokens: 6, temperature: 0,
    include: ['message.output_text.logprobs'], top_logprobs: 2 };
  const r = await client.responses.create(params);
  const lp = r.output[0].content[0].logprobs;
  assert.equal(lp.length, r.usage.output_tokens);
  for (const e of lp) {
    assert.equal(typeof e.logprob, 'number');
    assert.equal(e.top_logprobs.length, 2);
  }
  const { final } = await streamed(params);
  assert.deepEqual(final.output[0].content[0].logprobs.map((e) => e.token), lp.map((e) => e.token));
});

test('what a stateless server does not serve is a 400 (or 404) naming it', async () => {
  const bad = [
    [{ previous_response_id: 'resp_1' }, 'previous_response_id'],
    [{ store: true }, 'store'],
    [{ background: true }, 'background'],
    [{ conversation: 'conv_1' }, 'conversation'],
    [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
    [{ tools: [{ type: 'function', name: 'bad name' }] }, 'tools[0].name'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x' }] }] }, 'input[0].content[0].type'],
    [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, 'input[0]'],
    [{ input: [{ role: 'user', content: 'a' }, { role: 'wizard', content: 'b' }] }, 'input[1].role'],
    [{ reasoning: { effort: 'high' } }, 'reasoning.effort'],
    [{ include: ['reasoning.encrypted_content'] }, 'include[0]'],
    [{ truncation: 'auto' }, 'truncation'],
    [{ max_output_tokens: 0 }, 'max_output_tokens'],
    [{ text: { format: { type: 'yaml' } } }, 'text.format.type'],
    [{ input: [] }, 'input'],
  ];
  for (const [fields, param] of bad) {
    await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', ...fields }),
      (e) => e.status === 400 && e.param === param, `${JSON.stringify(fields)}: ${param}`);
  }
  await assert.rejects(client.responses.retrieve('resp_123'), (e) => e.status === 404 && /stateless/.test(e.message));
  const deep = await fetch(`${base}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: `{"model":"tiny","input":"x","metadata":${'['.repeat(5000)}${']'.repeat(5000)}}` });
  assert.equal(deep.status, 400);
});
