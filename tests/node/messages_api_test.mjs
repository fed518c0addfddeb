// Anthropic's Messages API (POST /v1/messages) end to end through kvserve-router and
// kvserve-worker with Anthropic's official TypeScript client (@anthropic-ai/sdk): messages.create
// and messages.stream (whose accumulator builds the message from the events), the same tokens
// as the equivalent chat completion, stop_sequences, tools (any and a named tool, streamed and
// not, their results sent back as tool_result blocks), count_tokens, the X-Api-Key header, and
// the 400s in Anthropic's error shape. The model's weights are random: only constraints shape
// its calls.
//
//   node messages_api_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';
import { zodOutputFormat } from '@anthropic-ai/sdk/helpers/zod';
import Ajv from 'ajv';
import OpenAI from 'openai';
import * as z from 'zod/v4';

import { makeModel, startRouter, startWorkerAndRouter } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-messages-'));
const children = [];
let client;
let openai;
let keyed;  // a router with --api-keys

const weather = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const tools = [{ name: 'get_weather', description: 'Weather in a city', input_schema: weather }];
const valid = new Ajv({ strict: false }).compile(weather);

before(async () => {
  const model = path.join(tmp, 'tiny');
  makeModel(bin, tokenizerDir, model);
  const { base, worker } = await startWorkerAndRouter(bin, model, children);
  client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
  openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const keyedBase = await startRouter(bin, model, children, worker, ['--api-keys', 'sk-test']);
  keyed = (apiKey) => new Anthropic({ baseURL: keyedBase, apiKey, maxRetries: 0 });
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('messages.create: the same tokens as the chat completion, usage and stop_reason', async () => {
  const m = await client.messages.create({ model: 'tiny', max_tokens: 12, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Say hello.' }] });
  const chat = await openai.chat.completions.create({ model: 'tiny', max_tokens: 12, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hello.' }] });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.equal(text, chat.choices[0].message.content);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, chat.usage.prompt_tokens);
  assert.equal(m.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(m.stop_reason, chat.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  // Blocks as content, and count_tokens of the same prompt.
  const blocks = await client.messages.create({ model: 'tiny', max_tokens: 12, temperature: 0,
    system: [{ type: 'text', text: 'Be brief.' }],
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Say ' }, { type: 'text', text: 'hello.' }] }] });
  assert.deepEqual(blocks.content, m.content);
  const counted = await client.messages.countTokens({ model: 'tiny', system: 'Be brief.',
    messages: [{ role: 'user', content: 'Say hello.' }] });
  assert.equal(counted.input_tokens, chat.usage.prompt_tokens);
});

test('messages.stream: events build the same message as whole', async () => {
  const params = { model: 'tiny', max_tokens: 16, temperature: 0, messages: [{ role: 'user', content: 'Count.' }] };
  const whole = await client.messages.create(params);
  const stream = client.messages.stream(params);
  const types = [];
  stream.on('streamEvent', (e) => types.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
});

test('stop_sequences: stop_reason stop_sequence names the string', async () => {
  const params = { model: 'tiny', max_tokens: 40, temperature: 0, messages: [{ role: 'user', content: 'Talk.' }] };
  const free = await client.messages.create(params);
  const text = free.content.map((b) => b.text).join('');
  const stop = text.slice(6, 8);
  assert.ok(stop.length === 2, `too short an output to cut: ${JSON.stringify(text)}`);
  const cut = await client.messages.create({ ...params, stop_sequences: [stop] });
  assert.equal(cut.stop_reason, 'stop_sequence');
  assert.equal(cut.stop_sequence, stop);
  assert.ok(!cut.content.map((b) => b.text).join('').includes(stop));
});

test('tools: any and a named tool give valid tool_use blocks, streamed and not, and results go back', async () => {
  let called = 0;
  for (const [i, tool_choice] of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }].entries()) {
    const params = { model: 'tiny', max_tokens: 200, temperature: 1, seed: 5 + i, tools, tool_choice,
      messages: [{ role: 'user', content: 'Weather in Paris?' }] };
    for (const streamed of [false, true]) {
      const m = streamed ? await client.messages.stream(params).finalMessage() : await client.messages.create(params);
      if (m.stop_reason !== 'tool_use') continue;
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.ok(uses.length > 0, JSON.stringify(m.content));
      for (const u of uses) {
        assert.equal(u.name, 'get_weather');
        assert.ok(valid(u.input), JSON.stringify(u.input));
      }
      called++;
      const next = await client.messages.create({ model: 'tiny', max_tokens: 8, tools,
        tool_choice: { type: 'none' }, messages: [{ role: 'user', content: 'Weather in Paris?' },
          { role: 'assistant', content: m.content },
          { role: 'user', content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, content: '21C' })) }] });
      assert.equal(next.content.filter((b) => b.type === 'tool_use').length, 0);
    }
  }
  assert.ok(called >= 2, `only ${called} of 4 messages ended with tool_use`);
});

// A final assistant message is a prefill: the answer continues it (the same tokens as chat's
// continue_final_message), rather than opening a new assistant turn.
test('a final assistant turn is continued', async () => {
  const messages = [{ role: 'user', content: 'Name a colour.' }, { role: 'assistant', content: 'My favourite colour is' }];
  const m = await client.messages.create({ model: 'tiny', max_tokens: 8, temperature: 0, messages });
  const chat = await openai.chat.completions.create({ model: 'tiny', max_tokens: 8, temperature: 0, messages,
    continue_final_message: true, add_generation_prompt: false });
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.equal(text, chat.choices[0].message.content);
  const fresh = await openai.chat.completions.create({ model: 'tiny', max_tokens: 8, temperature: 0,
    messages: [...messages, { role: 'user', content: 'x' }].slice(0, 1) });
  assert.notEqual(text, fresh.choices[0].message.content);  // not a new turn
  // As Anthropic's API: an empty final turn asks for nothing; trailing whitespace is a 400.
  const empty = await client.messages.create({ model: 'tiny', max_tokens: 8, temperature: 0,
    messages: [messages[0], { role: 'assistant', content: '' }] });
  assert.equal(empty.content.map((b) => b.text).join(''), fresh.choices[0].message.content);
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 8,
    messages: [messages[0], { role: 'assistant', content: 'My colour is ' }] }),
  (e) => e.status === 400 && /messages\[1\]\.content/.test(e.message));
});

// Structured outputs: output_config.format (what messages.parse with zodOutputFormat sends) and
// the beta's output_format, held to the schema by the constraint engine.
test('output_config.format and output_format: JSON that validates', async () => {
  const Answer = z.object({ colour: z.enum(['red', 'green', 'blue']), sure: z.boolean() });
  const parsed = await client.messages.parse({ model: 'tiny', max_tokens: 64, temperature: 1, seed: 1,
    messages: [{ role: 'user', content: 'Pick a colour.' }], output_config: { format: zodOutputFormat(Answer) } });
  assert.equal(parsed.stop_reason, 'end_turn');
  assert.ok(Answer.safeParse(parsed.parsed_output).success, JSON.stringify(parsed.parsed_output));
  const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 9 } },
    required: ['n'], additionalProperties: false };
  const beta = await client.messages.create({ model: 'tiny', max_tokens: 32, temperature: 1,
    messages: [{ role: 'user', content: 'A digit.' }], output_format: { type: 'json_schema', schema } });
  assert.equal(beta.stop_reason, 'end_turn');
  assert.ok(new Ajv().compile(schema)(JSON.parse(beta.content[0].text)), beta.content[0].text);
  // Errors name the Messages API's fields.
  for (const [extra, param] of [
    [{ output_config: { effort: 'high' } }, 'output_config.effort'],
    [{ output_config: { format: { type: 'regex', schema } } }, 'output_config.format.type'],
    [{ output_format: { type: 'json_schema', schema: { type: 'object', properties: { a: { type: 'nope' } } } } },
      'output_format.schema'],
    [{ temperature: 1.5 }, 'temperature'],
    [{ top_p: 1.2 }, 'top_p'],
  ]) {
    await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 8,
      messages: [{ role: 'user', content: 'x' }], ...extra }),
    (e) => e.status === 400 && e.message.includes(param), JSON.stringify(extra));
  }
});

test('the API key may come as X-Api-Key; errors are in Anthropic shape naming the field', async () => {
  const ok = await keyed('sk-test').messages.create({ model: 'tiny', max_tokens: 2,
    messages: [{ role: 'user', content: 'x' }] });
  assert.equal(ok.type, 'message');
  await assert.rejects(keyed('wrong').messages.create({ model: 'tiny', max_tokens: 2,
    messages: [{ role: 'user', content: 'x' }] }), (e) => e.status === 401 && e.error?.type === 'error');
  const bad = [
    [{ max_tokens: undefined }, /^max_tokens:/],
    [{ messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x' } }] }] },
      /^messages\[0\]\.content\[0\]\.type:/],
    [{ messages: [{ role: 'system', content: 'x' }] }, /^messages\[0\]\.role:/],
    [{ tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, /^tools\[0\]\.type:/],
    [{ tools: [{ name: 'bad name', input_schema: { type: 'object' } }] }, /^tools\[0\]\.name:/],
    [{ tools: [{ name: 'f', input_schema: { type: 'string' } }] }, /^tools\[0\]\.input_schema\.type:/],
    [{ thinking: { type: 'enabled', budget_tokens: 1024 } }, /^thinking\.budget_tokens:/],
    [{ stop_sequences: 'x' }, /^stop_sequences:/],
    [{ mcp_servers: [{ type: 'url', url: 'http://x', name: 'm' }] }, /^mcp_servers:/],
  ];
  for (const [fields, message] of bad) {
    await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 4,
      messages: [{ role: 'user', content: 'x' }], ...fields }),
    (e) => e.status === 400 && e.error?.type === 'error' && e.error.error.type === 'invalid_request_error' &&
      message.test(e.error.error.message), `${JSON.stringify(fields)}`);
  }
});
