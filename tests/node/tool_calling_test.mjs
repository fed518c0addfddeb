// Tool calling end to end through kvserve-router and kvserve-worker with the official `openai`
// client: tool_choice "required" and a named function (enforced by the constraint engine, so
// every call of a finished choice parses and its arguments validate with ajv against its tool's
// schema), streamed and not, the client's runTools loop (tool results sent back), "auto" read by
// the hermes and llama3_json parsers, and the 400s. The model's weights are random: only the
// constraints shape its calls.
//
//   node tool_calling_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import Ajv from 'ajv';
import OpenAI from 'openai';

import { freePort, makeModel, retryOnPortClash, startAndWait, startRouter, startWorkerAndRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-tools-'));
const children = [];
const clients = {};  // plain; hermes and llama3_json: routers serving tool_choice auto
let model;
let plainMetrics;  // the plain router's worker's /metrics

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: {
      city: { type: 'string', maxLength: 12 },
      unit: { enum: ['celsius', 'fahrenheit'] },
      days: { type: 'integer', minimum: 1, maximum: 7 } },
    required: ['city', 'unit'], additionalProperties: false } } },
  { type: 'function', function: { name: 'lookup', parameters: { type: 'object',
    properties: { ids: { type: 'array', items: { $ref: '#/$defs/id' }, maxItems: 3 } },
    required: ['ids'], additionalProperties: false, $defs: { id: { type: 'integer', minimum: 0, maximum: 999 } } } } },
  { type: 'function', function: { name: 'now' } },
];
const ajv = new Ajv({ strict: false });
const validators = Object.fromEntries(tools.map((t) =>
  [t.function.name, ajv.compile(t.function.parameters ?? { type: 'object', additionalProperties: false })]));
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

// Every call names a tool and its arguments (a JSON text) validate against the tool's schema.
function checkCalls(calls, where) {
  assert.ok(Array.isArray(calls) && calls.length > 0, `${where}: no tool calls`);
  for (const call of calls) {
    assert.equal(call.type, 'function', where);
    assert.match(call.id, /^call_[A-Za-z0-9]{24}$/, where);
    const validate = validators[call.function.name];
    assert.ok(validate, `${where}: unknown tool ${call.function.name}`);
    const args = JSON.parse(call.function.arguments);
    assert.ok(validate(args), `${where}: ${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
  }
}

before(async () => {
  model = path.join(tmp, 'tiny');
  makeModel(bin, tokenizerDir, model);
  const { base, worker, metrics } = await startWorkerAndRouter(bin, model, children);
  plainMetrics = metrics;
  const client = (url) => new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
  clients.plain = client(base);
  for (const parser of ['hermes', 'llama3_json']) {
    clients[parser] = client(await startRouter(bin, model, children, worker,
      ['--enable-auto-tool-choice', '--tool-call-parser', parser]));
  }
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('tool_choice required: every finished choice calls tools with valid arguments', async () => {
  let finished = 0;
  for (const parallel of [true, false]) {
    const r = await clients.plain.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required',
      parallel_tool_calls: parallel, n: 8, temperature: 1, seed: parallel ? 1 : 2, max_tokens: 300 });
    for (const c of r.choices) {
      if (c.finish_reason === 'length') {
        console.log(`# unfinished: ${c.message.content.slice(0, 300)}`);
        continue;
      }
      finished++;
      assert.equal(c.finish_reason, 'tool_calls');
      assert.equal(c.message.content, null);
      checkCalls(c.message.tool_calls, `required #${c.index}`);
      if (!parallel) assert.equal(c.message.tool_calls.length, 1);
    }
  }
  assert.ok(finished >= 12, `only ${finished} of 16 choices finished within 300 tokens`);
});

test('a named function: its arguments, streamed and not', async () => {
  const named = { type: 'function', function: { name: 'lookup' } };
  const r = await clients.plain.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: named,
    n: 4, temperature: 1, seed: 3, max_tokens: 200 });
  for (const c of r.choices.filter((c) => c.finish_reason !== 'length')) {
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].function.name, 'lookup');
    checkCalls(c.message.tool_calls, 'named');
  }
  // The client's stream helper assembles delta.tool_calls into the same message shape.
  const stream = clients.plain.chat.completions.stream({ model: 'tiny', messages, tools, tool_choice: named,
    temperature: 1, seed: 4, max_tokens: 200 });
  const final = await stream.finalChatCompletion();
  const choice = final.choices[0];
  if (choice.finish_reason !== 'length') {
    assert.equal(choice.finish_reason, 'tool_calls');
    checkCalls(choice.message.tool_calls, 'named, streamed');
  }
});

test('streamed required calls: whole calls in delta.tool_calls, the same as not streamed', async () => {
  const body = { model: 'tiny', messages, tools, tool_choice: 'required', temperature: 1, seed: 5, max_tokens: 300 };
  const whole = await clients.plain.chat.completions.create(body);
  const stream = await clients.plain.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    for (const t of c.delta.tool_calls ?? []) {
      assert.equal(t.index, calls.length);
      calls.push({ id: t.id, type: t.type, function: t.function });
    }
    finish = c.finish_reason ?? finish;
  }
  assert.equal(finish, whole.choices[0].finish_reason);
  if (finish === 'tool_calls') {
    checkCalls(calls, 'streamed');
    const strip = (list) => list.map((t) => t.function);
    assert.deepEqual(strip(calls), strip(whole.choices[0].message.tool_calls));  // same seed
  }
});

test('runTools: the client calls our functions and sends the results back', async () => {
  const seen = [];
  const runnable = tools.map((t) => ({ type: 'function', function: { ...t.function,
    parameters: t.function.parameters ?? { type: 'object', properties: {} },
    function: (args) => { seen.push(args); return { ok: true }; }, parse: JSON.parse } }));
  const runner = clients.plain.chat.completions.runTools({ model: 'tiny', messages, tools: runnable,
    tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed: 6 },
  { maxChatCompletions: 2 });
  await runner.done();
  const sent = runner.messages;
  assert.ok(sent.some((m) => m.role === 'tool'), 'no tool result went back');
  assert.ok(seen.length > 0);
});

test('tool_choice auto: hermes <tool_call> blocks and llama3_json objects become tool calls', async () => {
  // A regex stands in for a model that writes its calls: the parser must read them.
  const hermes = '<tool_call>\n\\{"name": "get_weather", "arguments": \\{"city": "[a-z]{1,8}", "unit": "celsius"\\}\\}\n</tool_call>';
  for (const stream of [false, true]) {
    const body = { model: 'tiny', messages, tools, temperature: 1, seed: 7, max_tokens: 200,
      structured_outputs: { regex: `Checking\\.\n${hermes}` } };
    let content = '';
    let calls = [];
    let finish;
    if (stream) {
      for await (const chunk of await clients.hermes.chat.completions.create({ ...body, stream: true })) {
        const c = chunk.choices[0];
        if (!c) continue;
        content += c.delta.content ?? '';
        calls.push(...(c.delta.tool_calls ?? []));
        finish = c.finish_reason ?? finish;
      }
    } else {
      const r = await clients.hermes.chat.completions.create(body);
      ({ content } = r.choices[0].message);
      calls = r.choices[0].message.tool_calls;
      finish = r.choices[0].finish_reason;
    }
    assert.equal(finish, 'tool_calls', `${content} ${JSON.stringify(calls)}`);
    assert.equal(content, 'Checking.\n');
    checkCalls(calls, `hermes${stream ? ', streamed' : ''}`);
    assert.match(calls[0].function.arguments, /^\{"city": "[a-z]+", "unit": "celsius"\}$/);
  }
  const r = await clients.llama3_json.chat.completions.create({ model: 'tiny', messages, tools, temperature: 1,
    seed: 8, max_tokens: 200,
    structured_outputs: { regex: '\\{"name": "lookup", "parameters": \\{"ids": \\[(0|[1-9][0-9]{0,2})\\]\\}\\}' } });
  assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0].message));
  checkCalls(r.choices[0].message.tool_calls, 'llama3_json');
  // Plain text stays content under auto.
  const text = await clients.hermes.chat.completions.create({ model: 'tiny', messages, tools, max_tokens: 64,
    seed: 9, structured_outputs: { choice: ['It is sunny.'] } });
  assert.equal(text.choices[0].message.content, 'It is sunny.');
  assert.equal(text.choices[0].message.tool_calls, undefined);
  assert.equal(text.choices[0].finish_reason, 'stop');
});

// `parameters: {}` is a function of no parameters (vLLM's and OpenAI's reading): its arguments
// are always {}. Before, the empty schema let the model write any JSON value there (-609, a
// string, an array) and the array ended in content with finish_reason stop.
test('parameters {}: the arguments are an empty object, required and named', async () => {
  const empty = [{ type: 'function', function: { name: 'ping', parameters: {} } }];
  let finished = 0;
  for (const choice of ['required', { type: 'function', function: { name: 'ping' } }]) {
    const r = await clients.plain.chat.completions.create({ model: 'tiny', messages, tools: empty,
      tool_choice: choice, n: 8, temperature: 1, seed: 10, max_tokens: 200 });
    for (const c of r.choices.filter((c) => c.finish_reason !== 'length')) {
      finished++;
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      assert.equal(c.message.tool_calls.length >= 1, true);
      for (const call of c.message.tool_calls) {
        assert.equal(call.function.name, 'ping');
        assert.deepEqual(JSON.parse(call.function.arguments), {});
      }
    }
  }
  assert.ok(finished >= 12, `only ${finished} of 16 choices finished within 200 tokens`);
});

// Compact JSON (the default) leaves a forced call's tokens to the call: with max_tokens 48 most
// samples of the random model finish with a parsed call (with any whitespace, 7 of 16 did, and
// none with one enum parameter: docs/STRUCTURED_OUTPUTS.md).
test('compact JSON: a forced call finishes within 48 tokens', async () => {
  const now = [{ type: 'function', function: { name: 'now' } }];
  let finished = 0;
  for (let seed = 0; seed < 16; seed++) {
    const r = await clients.plain.chat.completions.create({ model: 'tiny', messages, tools: now,
      tool_choice: 'required', max_tokens: 48, temperature: 1, seed });
    const c = r.choices[0];
    if (c.finish_reason !== 'tool_calls') continue;
    finished++;
    assert.equal(c.message.tool_calls[0].function.name, 'now');
    assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), {});
  }
  assert.ok(finished >= 9, `only ${finished} of 16 forced calls finished within 48 tokens`);
});

// Jump-forward decoding (worker --jump-forward, on by default): what the grammar forces (the
// call's name, its keys, an enum's rest once its first letter is drawn) is appended without a
// draw, so one forced call with parameters fits 48 tokens. Side by side with a worker that draws
// every token. (With parallel calls the random model starts a second call about half the time,
// which no jump can end.)
test('jump-forward: forced calls with parameters finish within 48 tokens', async () => {
  const [port, events, metrics] = [await freePort(), await freePort(), await freePort()];
  await retryOnPortClash(() => startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model,
    '--host', '127.0.0.1', '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
    '--max-model-len', '1024', '--num-blocks', '512', '--jump-forward=false'], /kvserve-worker ready/));
  const drawn = new OpenAI({ baseURL: `${await startRouter(bin, model, children, `127.0.0.1:${port}:${events}`)}/v1`,
    apiKey: 'unused', maxRetries: 0 });
  const weather = [tools[0]];
  const finished = {};
  for (const [name, client] of [['jumped', clients.plain], ['drawn', drawn]]) {
    finished[name] = 0;
    for (let seed = 0; seed < 16; seed++) {
      const r = await client.chat.completions.create({ model: 'tiny', messages, tools: weather,
        tool_choice: 'required', parallel_tool_calls: false, max_tokens: 48, temperature: 1, seed });
      const c = r.choices[0];
      assert.ok(r.usage.completion_tokens <= 48);
      if (c.finish_reason !== 'tool_calls') continue;
      finished[name]++;
      checkCalls(c.message.tool_calls, `${name} seed ${seed}`);
    }
  }
  console.log(`# forced get_weather calls finished within 48 tokens: ${finished.jumped}/16 jumped, ${finished.drawn}/16 drawn`);
  assert.ok(finished.jumped >= 15, JSON.stringify(finished));
  const jumped = async (url) => Number(/^kvserve_jump_forward_tokens_total\{[^}]*\} (\S+)$/m
    .exec(await (await fetch(url)).text())[1]);
  assert.ok(await jumped(plainMetrics) > 0);
  assert.equal(await jumped(`http://127.0.0.1:${metrics}/metrics`), 0);
  // logprobs asked: every token drawn, each with its logprob.
  const before = await jumped(plainMetrics);
  const r = await clients.plain.chat.completions.create({ model: 'tiny', messages, tools: weather,
    tool_choice: 'required', max_tokens: 48, temperature: 1, seed: 3, logprobs: true });
  assert.equal(r.choices[0].logprobs.content.length, r.usage.completion_tokens);
  assert.equal(await jumped(plainMetrics), before);
});

test('refusals name the parameter', async () => {
  const cases = [
    [clients.plain, { tools }, 'tool_choice', /--enable-auto-tool-choice/],
    [clients.plain, { tools: [{ type: 'function', function: { name: 'has space' } }], tool_choice: 'required' },
      'tools[0].function.name', /letters/],
    [clients.plain, { tools, tool_choice: { type: 'function', function: { name: 'missing' } } }, 'tool_choice', /missing/],
    [clients.plain, { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
      properties: { a: { type: 'string', format: 'no-such-format' } } } } }], tool_choice: 'required' },
    'tools[0].function.parameters', /format/],
    [clients.plain, { tool_choice: 'required' }, 'tool_choice', /needs tools/],
    [clients.plain, { tool_choice: 'auto' }, 'tool_choice', /needs tools/],
    [clients.plain, { tools: [], tool_choice: 'none' }, 'tools', /empty list/],
    [clients.plain, { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'string' } } }],
      tool_choice: 'required' }, 'tools[0].function.parameters.type', /"object"/],
  ];
  for (const [client, extra, param, message] of cases) {
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, max_tokens: 4, ...extra }),
      (e) => e.status === 400 && e.param === param && message.test(e.message), JSON.stringify(extra));
  }
  // tool_choice none: tools are in the prompt, the output is plain content.
  const r = await clients.plain.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'none',
    max_tokens: 4 });
  assert.equal(r.choices[0].message.tool_calls, undefined);
});
