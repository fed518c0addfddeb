// OpenAI's Responses API (POST /v1/responses) end to end through kvserve-router and
// kvserve-worker with the official `openai` client: responses.create and responses.stream (whose
// accumulator checks every event's indexes and item ids), the same tokens as the equivalent chat
// completion, function tools (required and named, streamed and not, and their results sent back
// as items), text.format json_schema, logprobs, the 400s of what kvserve does not serve, and
// stored responses: retrieve, chains by previous_response_id, input_items, delete, tenants by API
// key, and a store in a real redis-server shared by two router replicas over two workers. The
// model's weights are random: only constraints shape its calls.
//
//   node responses_api_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import Ajv from 'ajv';
import OpenAI from 'openai';

import { freePort, makeModel, retryOnPortClash, startAndWait, startRouter, startWorkerAndRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-responses-'));
const children = [];
let client;
let base;
let model;
let worker;

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
  model = path.join(tmp, 'tiny');
  makeModel(bin, tokenizerDir, model);
  ({ base, worker } = await startWorkerAndRouter(bin, model, children));
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
  assert.equal(r.store, true);  // OpenAI's default
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

test('what kvserve does not serve is a 400 (or 404) naming it', async () => {
  const bad = [
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
  await assert.rejects(client.responses.retrieve('resp_123'), (e) => e.status === 404 && /no stored response/.test(e.message));
  await assert.rejects(client.responses.create({ model: 'tiny', input: 'x', previous_response_id: 'resp_123' }),
    (e) => e.status === 404 && /previous_response_id: no stored response 'resp_123'/.test(e.message));
  const deep = await fetch(`${base}/v1/responses`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: `{"model":"tiny","input":"x","metadata":${'['.repeat(5000)}${']'.repeat(5000)}}` });
  assert.equal(deep.status, 400);
});

// A prompt of many blocks, so that a chain's first turn leaves whole blocks in the cache.
const long = (tag) => `My name is Ada ${tag}. ` + Array.from({ length: 80 }, (_, i) => `word${i}`).join(' ');
const fields = (r) => JSON.stringify([r.id, r.status, r.output, r.usage, r.store, r.previous_response_id]);
const bodyOf = async (url, init) => { const r = await fetch(url, init); return { status: r.status, body: await r.json() }; };

test('stored responses: retrieve, chain by previous_response_id, input_items, cancel, delete', async () => {
  const first = await client.responses.create({ model: 'tiny', input: long('a'), max_output_tokens: 6, temperature: 0 });
  assert.equal(fields(await client.responses.retrieve(first.id)), fields(first));
  const second = await client.responses.create({ model: 'tiny', previous_response_id: first.id,
    input: 'What is my name?', max_output_tokens: 6, temperature: 0 });
  assert.equal(second.previous_response_id, first.id);
  // The chained request asks what the whole conversation as chat asks.
  const chat = await client.chat.completions.create({ model: 'tiny', max_tokens: 6, temperature: 0, messages: [
    { role: 'user', content: long('a') }, { role: 'assistant', content: first.output_text },
    { role: 'user', content: 'What is my name?' }] });
  assert.equal(second.output_text, chat.choices[0].message.content);
  assert.equal(second.usage.input_tokens, chat.usage.prompt_tokens);
  assert.ok(second.usage.input_tokens_details.cached_tokens >= 64, JSON.stringify(second.usage));
  // A chain of three: the third sees both earlier turns.
  const third = await client.responses.create({ model: 'tiny', previous_response_id: second.id,
    input: 'And again?', max_output_tokens: 2, temperature: 0 });
  assert.ok(third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens);

  // input_items: this response's own input, newest first by default, paged by `after`.
  const listed = [];
  for await (const item of client.responses.inputItems.list(second.id)) listed.push(item);
  assert.deepEqual(listed.map((i) => [i.type, i.role, i.content[0].text]), [['message', 'user', 'What is my name?']]);
  assert.match(listed[0].id, /^msg_/);
  const many = await client.responses.create({ model: 'tiny', max_output_tokens: 1,
    input: ['a', 'b', 'c'].map((content) => ({ role: 'user', content })) });
  const url = `${base}/v1/responses/${many.id}/input_items`;
  const page = (await bodyOf(`${url}?limit=2&order=asc`)).body;
  assert.deepEqual(page.data.map((i) => i.content), ['a', 'b']);
  assert.equal(page.has_more, true);
  assert.equal(page.first_id, page.data[0].id);
  const rest = (await bodyOf(`${url}?limit=2&order=asc&after=${page.last_id}`)).body;
  assert.deepEqual(rest.data.map((i) => i.content), ['c']);
  assert.equal(rest.has_more, false);
  const all = [];
  for await (const item of client.responses.inputItems.list(many.id, { limit: 1 })) all.push(item.content);
  assert.deepEqual(all, ['c', 'b', 'a']);
  for (const [query, param] of [['limit=0', 'limit'], ['order=up', 'order'], ['after=msg_x', 'after'], ['include[]=x', 'include[]']]) {
    const r = await bodyOf(`${url}?${query}`);
    assert.equal(r.status, 400, query);
    assert.equal(r.body.error.param, param, query);
  }

  // Streamed responses are stored as they end; store false keeps nothing.
  const { final } = await streamed({ model: 'tiny', input: 'Stream me.', max_output_tokens: 4 });
  assert.equal((await client.responses.retrieve(final.id)).output_text, final.output_text);
  const unstored = await client.responses.create({ model: 'tiny', input: 'x', max_output_tokens: 1, store: false });
  assert.equal(unstored.store, false);
  await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);

  const cancel = await bodyOf(`${base}/v1/responses/${first.id}/cancel`, { method: 'POST' });
  assert.equal(cancel.status, 400);
  assert.match(cancel.body.error.message, /only background responses/);
  const deleted = await bodyOf(`${base}/v1/responses/${first.id}`, { method: 'DELETE' });
  assert.deepEqual(deleted, { status: 200, body: { id: first.id, object: 'response', deleted: true } });
  await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404);
  await assert.rejects(client.responses.delete(first.id), (e) => e.status === 404);
  await assert.rejects(client.responses.create({ model: 'tiny', previous_response_id: first.id, input: 'x' }),
    (e) => e.status === 404 && /previous_response_id/.test(e.message));
  await client.responses.delete(second.id);  // the SDK's own call
  await assert.rejects(client.responses.retrieve(second.id), (e) => e.status === 404);
});

test('a tenant (API key) cannot read, chain from or delete another tenant\'s responses', async () => {
  const keyed = await startRouter(bin, model, children, worker, ['--api-keys', 'k1,k2']);
  const as = (key) => new OpenAI({ baseURL: `${keyed}/v1`, apiKey: key, maxRetries: 0 });
  const mine = await as('k1').responses.create({ model: 'tiny', input: 'secret', max_output_tokens: 2 });
  assert.equal((await as('k1').responses.retrieve(mine.id)).id, mine.id);
  await assert.rejects(as('k2').responses.retrieve(mine.id), (e) => e.status === 404);
  await assert.rejects(as('k2').responses.inputItems.list(mine.id), (e) => e.status === 404);
  await assert.rejects(as('k2').responses.create({ model: 'tiny', previous_response_id: mine.id, input: 'x' }),
    (e) => e.status === 404);
  await assert.rejects(as('k2').responses.delete(mine.id), (e) => e.status === 404);
  await assert.rejects(as('k3').responses.retrieve(mine.id), (e) => e.status === 401);
  assert.equal((await as('k1').responses.retrieve(mine.id)).id, mine.id);  // still there
});

// A redis-server on a free loopback port, nothing saved to disk; resolves with its process.
function startRedis(port) {
  return startAndWait(children, 'redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no', '--dir', tmp], /Ready to accept connections/);
}

test('two router replicas share a Redis store: one stores, the other retrieves and chains on the worker that caches it', async () => {
  const [redisPort, wPort, wEvents] = [await freePort(), await freePort(), await freePort()];
  let redis = await startRedis(redisPort);
  await retryOnPortClash(() => startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model,
    '--host', '127.0.0.1', '--port', String(wPort), '--events-port', String(wEvents), '--metrics-port', '0',
    '--max-model-len', '1024', '--num-blocks', '512'], /kvserve-worker ready/));
  const workers = `${worker},127.0.0.1:${wPort}:${wEvents}`;
  const store = ['--responses-store', `redis://127.0.0.1:${redisPort}`];
  const [a, b] = [await startRouter(bin, model, children, workers, store), await startRouter(bin, model, children, workers, store)];
  const at = (url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  for (const tag of ['r1', 'r2', 'r3', 'r4']) {
    const first = await at(a).responses.create({ model: 'tiny', input: long(tag), max_output_tokens: 4, temperature: 0 });
    assert.equal(fields(await at(b).responses.retrieve(first.id)), fields(first));
    await new Promise((res) => setTimeout(res, 300));  // b learns the blocks from the KV events
    const next = await at(b).responses.create({ model: 'tiny', previous_response_id: first.id, input: 'Who?',
      max_output_tokens: 2, temperature: 0 });
    // b sent the chain to the worker that holds its conversation: the prefix was cached.
    assert.ok(next.usage.input_tokens_details.cached_tokens >= 64, `${tag}: ${JSON.stringify(next.usage)}`);
    assert.equal(fields(await at(a).responses.retrieve(next.id)), fields(next));
  }
  // The store gone: answering goes on (the response is not kept), reading it is a 503.
  const kept = await at(a).responses.create({ model: 'tiny', input: 'kept', max_output_tokens: 1 });
  redis.kill('SIGKILL');
  await new Promise((res) => redis.once('exit', res));
  const lost = await at(a).responses.create({ model: 'tiny', input: 'not kept', max_output_tokens: 1 });
  assert.equal(lost.status === 'completed' || lost.status === 'incomplete', true);
  await assert.rejects(at(b).responses.retrieve(kept.id), (e) => e.status === 503 && /Responses store/.test(e.message));
  // Back (empty: nothing was saved): the replicas reconnect once a second has passed since their
  // last failed connect (until then they fail at once rather than wait on a store that is down).
  redis = await startRedis(redisPort);
  await new Promise((res) => setTimeout(res, 1100));
  await assert.rejects(at(b).responses.retrieve(kept.id), (e) => e.status === 404);
  const again = await at(a).responses.create({ model: 'tiny', input: 'again', max_output_tokens: 1 });
  assert.equal((await at(b).responses.retrieve(again.id)).id, again.id);
  redis.kill('SIGTERM');
});
