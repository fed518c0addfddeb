// The official `openai` npm client against kvserve-router in front of a kvserve-worker:
// models, completions and chat, streaming and not, n > 1, stop strings, logprobs, usage, and
// errors in OpenAI's shape. The model is a random-weight Llama made with kvserve-make-model
// around the real Llama 3 tokenizer, so texts are random but every mechanism is real.
//
//   node router_openai_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';

import { freePort, makeModel, retryOnPortClash, startAndWait as start } from './lib/harness.mjs';
import { readSafetensors } from './lib/safetensors.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-router-'));
const model = path.join(tmp, 'tiny');
const children = [];
let client;
let base;
let workerArg;
let router;
let workerMetrics;



before(async () => {
  makeModel(bin, tokenizerDir, model);
  const [port, events, metrics, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
  await start(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1', '--port', String(port),
    '--events-port', String(events), '--metrics-port', String(metrics), '--max-model-len', '1024', '--num-blocks', '512'], /kvserve-worker ready/);
  workerArg = `127.0.0.1:${port}:${events}`;
  workerMetrics = `http://127.0.0.1:${metrics}/metrics`;
  router = await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
    '--workers', workerArg, '--max-model-len', '1024', '--max-logprobs', '128256'], /kvserve-router ready/);
  base = `http://127.0.0.1:${http}`;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  // Wait for the worker's first heartbeat to reach the router.
  for (let i = 0; i < 100; i++) {
    const r = await fetch(`http://127.0.0.1:${http}/ready`);
    if (r.status === 200) break;
    await new Promise((res) => setTimeout(res, 50));
  }
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('/ready counts the routable workers against min_workers', async () => {
  const ready = await fetch(`${base}/ready`);
  assert.equal(ready.status, 200);
  assert.match(await ready.text(), /^ready: 1\/1 workers/);
  assert.equal((await fetch(`${base}/ready?min_workers=1`)).status, 200);
  const two = await fetch(`${base}/ready?min_workers=2`);
  assert.equal(two.status, 503);
  assert.match(await two.text(), /^not ready: 1\/1 workers/);
  assert.equal((await fetch(`${base}/ready?min_workers=x`)).status, 400);
  assert.equal((await fetch(`${base}/ready?min_workers=-1`)).status, 400);
});

test('answered connections are closed: the router holds no socket per finished request', async () => {
  const openFds = () => fs.readdirSync(`/proc/${router.pid}/fd`).length;
  const before = openFds();
  for (let i = 0; i < 30; i++) {
    const body = { model: 'tiny', prompt: `leak check ${i}`, max_tokens: 2, stream: i % 2 === 1 };
    const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    assert.equal(r.status, 200);
    await r.text();
  }
  // A response's socket lingers at most 5 s for a client that neither finishes nor closes.
  await new Promise((res) => setTimeout(res, 6000));
  assert.ok(openFds() <= before + 3, `open descriptors: ${before} before, ${openFds()} after 30 requests`);
});

test('models, version and invocations as vLLM serves them', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ['tiny']);
  assert.equal(list.data[0].root, model);  // --model as given
  assert.equal(list.data[0].parent, null);
  const version = await (await fetch(`${base}/version`)).json();
  assert.match(version.version, /^\d+\.\d+\.\d+/);
  // SageMaker's /invocations: the body's shape picks the API.
  const invoke = async (body) => fetch(`${base}/invocations`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const chat = await (await invoke({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], max_tokens: 2 })).json();
  assert.equal(chat.object, 'chat.completion');
  const completion = await (await invoke({ model: 'tiny', prompt: 'x', max_tokens: 2 })).json();
  assert.equal(completion.object, 'text_completion');
  // vLLM's request_id names the answer; two requests may give the same one.
  const named = await Promise.all([1, 2].map(() => client.chat.completions.create({ model: 'tiny',
    messages: [{ role: 'user', content: 'x' }], max_tokens: 2, request_id: 'trace-42' })));
  for (const r of named) assert.equal(r.id, 'chatcmpl-trace-42');
  const bad = await invoke({ model: 'tiny', input: 'x' });
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).error.message, /messages.*prompt/);
});

test('completions: n, logprobs, usage', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: 'The paged KV cache', max_tokens: 6, n: 2,
    logprobs: 2, seed: 3, temperature: 0.8 });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'length');
    assert.equal(c.logprobs.tokens.length, 6);
    assert.equal(c.logprobs.token_logprobs.length, 6);
    // As OpenAI's legacy API and vLLM: the chosen token and the 2 most likely (2 or 3 entries).
    for (const [i, top] of c.logprobs.top_logprobs.entries()) {
      assert.ok(Object.keys(top).length === 2 || Object.keys(top).length === 3, JSON.stringify(top));
      assert.equal(top[c.logprobs.tokens[i]], c.logprobs.token_logprobs[i]);
    }
    assert.equal(c.logprobs.tokens.join(''), c.text);
  }
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.usage.prompt_tokens > 0);
  // vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:ID"; the text is text.
  const ids = await client.completions.create({ model: 'tiny', prompt: 'The paged KV cache', max_tokens: 4,
    logprobs: 1, temperature: 0, return_tokens_as_token_ids: true });
  const named = ids.choices[0].logprobs;
  assert.equal(named.tokens.length, 4);
  for (const [i, t] of named.tokens.entries()) {
    assert.match(t, /^token_id:\d+$/);
    assert.ok(Object.keys(named.top_logprobs[i]).every((k) => /^token_id:\d+$/.test(k)));
  }
  // Each position's top_logprobs names the chosen token first, echoed prompt tokens included
  // (vLLM's test_return_tokens_as_token_ids compares each dict's first key with the tokens; the
  // first prompt token has no logprobs).
  const echoed = await client.completions.create({ model: 'tiny', prompt: 'The paged KV cache',
    max_tokens: 4, echo: true, logprobs: 1, temperature: 0, return_tokens_as_token_ids: true });
  const el = echoed.choices[0].logprobs;
  assert.deepEqual(el.top_logprobs.slice(1).map((top) => Object.keys(top)[0]), el.tokens.slice(1));
  const plainIds = await client.completions.create({ model: 'tiny', prompt: 'The paged KV cache', max_tokens: 4,
    logprobs: 1, temperature: 0 });
  assert.equal(ids.choices[0].text, plainIds.choices[0].text);
  assert.deepEqual(named.text_offset, plainIds.choices[0].logprobs.text_offset);
  const chatIds = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'x' }],
    max_tokens: 2, logprobs: true, top_logprobs: 1, return_tokens_as_token_ids: true });
  for (const e of chatIds.choices[0].logprobs.content) {
    assert.match(e.token, /^token_id:\d+$/);
    assert.match(e.top_logprobs[0].token, /^token_id:\d+$/);
  }
  // logprobs 0: the chosen token alone.
  const zero = await client.completions.create({ model: 'tiny', prompt: 'The paged KV cache', max_tokens: 3,
    logprobs: 0, seed: 3, temperature: 0.8 });
  const lp = zero.choices[0].logprobs;
  assert.deepEqual(lp.top_logprobs, lp.tokens.map((t, i) => ({ [t]: lp.token_logprobs[i] })));
});

// vLLM's truncate_prompt_tokens and truncation_side: the last N ids by default ("left"), the
// first N with "right"; another side is refused by name.
test('truncation_side picks the end truncate_prompt_tokens keeps', async () => {
  const prompt = [101, 102, 103, 104, 105, 106];
  const ask = (extra) => client.completions.create({ model: 'tiny', prompt, max_tokens: 1,
    temperature: 0, return_token_ids: true, truncate_prompt_tokens: 2, ...extra });
  assert.deepEqual((await ask({})).choices[0].prompt_token_ids, [105, 106]);
  assert.deepEqual((await ask({ truncation_side: 'left' })).choices[0].prompt_token_ids, [105, 106]);
  assert.deepEqual((await ask({ truncation_side: 'right' })).choices[0].prompt_token_ids, [101, 102]);
  await assert.rejects(ask({ truncation_side: 'middle' }),
    (e) => e.status === 400 && e.param === 'truncation_side');
});

// vLLM's return_token_ids: the prompt's ids (chat: at the top; completions: per choice) and
// each choice's, whole and streamed (the prompt's in the first chunk, then each chunk's own).
test('return_token_ids: prompt and output ids, whole and streamed', async () => {
  const base = client.baseURL.replace(/\/v1$/, '');
  const messages = [{ role: 'user', content: 'Name a color.' }];
  const tokenized = await (await fetch(`${base}/tokenize`, { method: 'POST',
    body: JSON.stringify({ model: 'tiny', messages }) })).json();
  const chat = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 6, temperature: 0,
    return_token_ids: true });
  assert.deepEqual(chat.prompt_token_ids, tokenized.tokens);
  const ids = chat.choices[0].token_ids;
  assert.equal(ids.length, chat.usage.completion_tokens);
  const text = await (await fetch(`${base}/detokenize`, { method: 'POST',
    body: JSON.stringify({ model: 'tiny', tokens: ids }) })).json();
  assert.equal(text.prompt, chat.choices[0].message.content);
  const chunks = [];
  for await (const c of await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 6,
    temperature: 0, return_token_ids: true, stream: true })) chunks.push(c);
  assert.deepEqual(chunks[0].prompt_token_ids, tokenized.tokens);
  assert.ok(chunks.slice(1).every((c) => c.prompt_token_ids === undefined));
  assert.deepEqual(chunks.flatMap((c) => c.choices.flatMap((ch) => ch.token_ids ?? [])), ids);
  // Completions: per choice, two prompts.
  const prompts = ['The paged KV cache', 'Routing by prefix'];
  const r = await client.completions.create({ model: 'tiny', prompt: prompts, max_tokens: 3, temperature: 0,
    return_token_ids: true });
  for (const c of r.choices) {
    const want = await (await fetch(`${base}/tokenize`, { method: 'POST',
      body: JSON.stringify({ model: 'tiny', prompt: prompts[c.index] }) })).json();
    assert.deepEqual(c.prompt_token_ids, want.tokens);
    assert.equal(c.token_ids.length, 3);
  }
  const streamed = { 0: [], 1: [] };
  let promptIds = 0;
  for await (const chunk of await client.completions.create({ model: 'tiny', prompt: prompts, max_tokens: 3,
    temperature: 0, return_token_ids: true, stream: true })) {
    for (const c of chunk.choices) {
      streamed[c.index].push(...c.token_ids);
      if (c.prompt_token_ids) promptIds++;
    }
  }
  assert.equal(promptIds, 2);
  for (const c of r.choices) assert.deepEqual(streamed[c.index], c.token_ids);
  // Without it, no ids.
  const plain = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2 });
  assert.ok(!('prompt_token_ids' in plain) && !('token_ids' in plain.choices[0]));
});

// vLLM's top_logprobs -1 (its test_top_logprobs, with the server's --max-logprobs at the
// vocabulary's size, as here): every id of the model's vocabulary, best first, the chosen token
// among them with its own value; more than --max-logprobs is refused naming both.
test('top_logprobs -1: the whole vocabulary within --max-logprobs', async () => {
  const vocab = JSON.parse(fs.readFileSync(path.join(model, 'config.json'), 'utf8')).vocab_size;
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: 'Beijing is the capital of which country?' }];
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 1,
    logprobs: 'true', top_logprobs: -1, return_tokens_as_token_ids: true });
  const [entry] = r.choices[0].logprobs.content;
  assert.equal(entry.top_logprobs.length, vocab);
  assert.equal(new Set(entry.top_logprobs.map((t) => t.token)).size, vocab);
  for (let k = 1; k < vocab; k++) assert.ok(entry.top_logprobs[k - 1].logprob >= entry.top_logprobs[k].logprob);
  assert.equal(entry.top_logprobs.find((t) => t.token === entry.token).logprob, entry.logprob);
  const sum = entry.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0);
  assert.ok(Math.abs(sum - 1) < 1e-3, `probabilities sum to ${sum}`);
  // Ids the request bans (allowed_token_ids) have -inf, which is written as vLLM writes it: -9999.
  const banned = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 1,
    logprobs: true, top_logprobs: -1, allowed_token_ids: [5, 6, 7], return_tokens_as_token_ids: true });
  const all = banned.choices[0].logprobs.content[0].top_logprobs;
  assert.deepEqual(all.slice(0, 3).map((t) => t.token).sort(), ['token_id:5', 'token_id:6', 'token_id:7']);
  assert.ok(all.slice(3).every((t) => t.logprob === -9999), 'every other id at -9999');
  for (const [body, says] of [
    [{ messages, logprobs: true, top_logprobs: vocab + 1 }, `top_logprobs: ${vocab + 1} is more alternatives than this server returns: at most ${vocab} (--max-logprobs`],
    [{ messages, logprobs: true, top_logprobs: -1, max_tokens: 16 }, 'logprobs: prompts × n × max_tokens × (1 + alternatives)'],
  ]) {
    const res = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', ...body }) });
    assert.equal(res.status, 400);
    assert.ok((await res.json()).error.message.includes(says), says);
  }
});

// Chat's echo and prompt_logprobs, as vLLM's test_chat_echo asks them: echo starts the content
// with the last message when it has the answer's role (continue_final_message), whole and
// streamed, and adds nothing after a user turn; prompt_logprobs comes once, at the top.
test('chat echo and prompt_logprobs, as vLLM serves them', async () => {
  const saying = 'Here is a common saying about apple. An apple a day, keeps';
  const messages = [{ role: 'user', content: 'tell me a common saying' }, { role: 'assistant', content: saying }];
  const asked = { model: 'tiny', messages, max_tokens: 4, temperature: 0, continue_final_message: true,
    add_generation_prompt: false };
  const plain = await client.chat.completions.create({ ...asked, echo: false });
  const echoed = await client.chat.completions.create({ ...asked, echo: true });
  assert.ok(!plain.choices[0].message.content.includes(saying));
  assert.equal(echoed.choices[0].message.content, saying + plain.choices[0].message.content);
  let streamed = '';
  for await (const c of await client.chat.completions.create({ ...asked, echo: true, stream: true })) {
    streamed += c.choices[0]?.delta?.content ?? '';
  }
  assert.equal(streamed, echoed.choices[0].message.content);
  const user = await client.chat.completions.create({ model: 'tiny', messages: [messages[0]], max_tokens: 4,
    temperature: 0, echo: true });
  const userPlain = await client.chat.completions.create({ model: 'tiny', messages: [messages[0]], max_tokens: 4,
    temperature: 0 });
  assert.equal(user.choices[0].message.content, userPlain.choices[0].message.content, 'nothing echoed after a user turn');
  // prompt_logprobs: [null, {id: {logprob, rank, decoded_token}}, ...] over the rendered prompt.
  const scored = await client.chat.completions.create({ model: 'tiny', messages: [messages[0]], max_tokens: 1,
    prompt_logprobs: 2, return_token_ids: true });
  const lp = scored.prompt_logprobs;
  assert.equal(lp.length, scored.prompt_token_ids.length);
  assert.equal(lp[0], null);
  for (const [i, position] of lp.slice(1).entries()) {
    const entries = Object.entries(position);
    assert.ok(entries.length >= 2 && entries.length <= 3);
    assert.ok(String(scored.prompt_token_ids[i + 1]) in position, 'the prompt token itself');
    for (const [, v] of entries) assert.ok(v.logprob <= 0 && v.rank >= 1 && typeof v.decoded_token === 'string');
  }
  assert.ok(!('prompt_logprobs' in scored.choices[0]));
  // The whole vocabulary at every prompt position is over --max-logprob-entries here.
  const res = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', messages: [messages[0]], prompt_logprobs: -1 }) });
  assert.equal(res.status, 400);
  assert.match((await res.json()).error.message, /^prompt_logprobs: prompt tokens × n × \(1 \+ alternatives\)/);
});

// vLLM's logprob_token_ids: the given ids' logprobs at every generated position, in the given
// order, in place of the top alternatives (chat: top_logprobs; completions: beside the chosen
// token), streamed alike; the value of an id equals its value among the top ones.
test('logprob_token_ids: the given ids in place of the top ones', async () => {
  const messages = [{ role: 'user', content: 'Name a color.' }];
  const asked = { model: 'tiny', messages, max_tokens: 3, temperature: 0, logprobs: true,
    return_tokens_as_token_ids: true };
  const top = await client.chat.completions.create({ ...asked, top_logprobs: 20 });
  const first = top.choices[0].logprobs.content[0].top_logprobs;
  const ids = [first[3], first[0], first[17]].map((t) => Number(t.token.split(':')[1]));
  const given = await client.chat.completions.create({ ...asked, top_logprobs: 2, logprob_token_ids: ids });
  assert.equal(given.choices[0].message.content, top.choices[0].message.content);
  for (const e of given.choices[0].logprobs.content) {
    assert.deepEqual(e.top_logprobs.map((t) => t.token), ids.map((id) => `token_id:${id}`));
    assert.ok(e.top_logprobs.every((t) => t.logprob <= 0));
  }
  const values = given.choices[0].logprobs.content[0].top_logprobs.map((t) => t.logprob);
  for (const [k, i] of [3, 0, 17].entries()) assert.ok(Math.abs(values[k] - first[i].logprob) < 1e-5);
  const chunks = [];
  for await (const c of await client.chat.completions.create({ ...asked, logprob_token_ids: ids, stream: true })) {
    chunks.push(...(c.choices[0]?.logprobs?.content ?? []));
  }
  assert.deepEqual(chunks, given.choices[0].logprobs.content);
  // Completions: the chosen token and the given ids.
  const c = await client.completions.create({ model: 'tiny', prompt: 'The paged KV cache', max_tokens: 3,
    temperature: 0, logprobs: 0, logprob_token_ids: ids, return_tokens_as_token_ids: true });
  const lp = c.choices[0].logprobs;
  for (const [i, entry] of lp.top_logprobs.entries()) {
    const keys = new Set([lp.tokens[i], ...ids.map((id) => `token_id:${id}`)]);
    assert.deepEqual(new Set(Object.keys(entry)), keys);
  }
  // Refused as vLLM refuses them, naming the parameter; the vocabulary's size named.
  for (const [body, says] of [[{ logprob_token_ids: ids }, 'needs logprobs'],
    [{ logprobs: true, logprob_token_ids: [] }, 'must not be empty'],
    [{ logprobs: true, logprob_token_ids: [5, 9999999] }, 'vocabulary']]) {
    const err = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, ...body })
      .catch((e) => e);
    assert.equal(err.status, 400, JSON.stringify(body));
    assert.equal(err.error.param, 'logprob_token_ids');
    assert.match(err.error.message, new RegExp(says));
  }
});

test('chat, streaming with usage, and the same text without streaming', async () => {
  const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something.' }];
  const plain = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0 });
  assert.equal(plain.choices[0].message.role, 'assistant');
  assert.equal(plain.choices[0].finish_reason, 'length');
  const stream = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) text += c.delta.content ?? '';
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(usage.completion_tokens, 10);
  // The second identical request finds its prompt's full blocks cached.
  assert.ok(usage.prompt_tokens_details.cached_tokens >= 0);
});

// vLLM's stream_options.continuous_usage_stats: every chunk carries its choice's usage so far,
// and the last usage chunk is the whole request's, as without it.
test('continuous usage stats in every streamed chunk', async () => {
  const body = { model: 'tiny', messages: [{ role: 'user', content: 'Count' }], max_tokens: 5, temperature: 0 };
  const whole = await client.chat.completions.create(body);
  let last = -1;
  let chunks = 0;
  let final;
  for await (const chunk of await client.chat.completions.create({ ...body, stream: true,
    stream_options: { continuous_usage_stats: true } })) {
    if (chunk.choices.length === 0) {
      final = chunk.usage;
      continue;
    }
    chunks++;
    assert.equal(chunk.usage.prompt_tokens, whole.usage.prompt_tokens);
    assert.ok(chunk.usage.completion_tokens >= last);
    assert.equal(chunk.usage.total_tokens, chunk.usage.prompt_tokens + chunk.usage.completion_tokens);
    last = chunk.usage.completion_tokens;
  }
  assert.ok(chunks > 1);
  assert.equal(last, 5);
  assert.equal(final.completion_tokens, whole.usage.completion_tokens);
});

test('stop strings end the text before the stop', async () => {
  const base = await client.completions.create({ model: 'tiny', prompt: 'Tell me a story', max_tokens: 24, temperature: 0 });
  const text = base.choices[0].text;
  const cut = Math.floor(text.length / 2);
  const stop = text.slice(cut, cut + 3);
  assert.ok(stop.length > 0);
  const r = await client.completions.create({ model: 'tiny', prompt: 'Tell me a story', max_tokens: 24, temperature: 0, stop: [stop] });
  assert.equal(r.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
  // vLLM's include_stop_str_in_output keeps the stop string at the end of the text.
  const kept = await client.completions.create({ model: 'tiny', prompt: 'Tell me a story', max_tokens: 24, temperature: 0,
    stop: [stop], include_stop_str_in_output: true });
  assert.equal(kept.choices[0].text, text.slice(0, text.indexOf(stop) + stop.length));
  assert.equal(kept.choices[0].finish_reason, 'stop');
});

test('errors in OpenAI shape', async () => {
  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }), (e) => e.status === 404);
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', n: 0 }),
    (e) => e.status === 400 && e.error?.param === 'n');
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 5000 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && e.param === 'prompt');
  // A parameter kvserve does not serve is refused, not silently ignored; served ones are
  // checked.
  await assert.rejects(client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'x' }], presence_penalty: 2.5 }),
  (e) => e.status === 400 && e.param === 'presence_penalty');
  // Every bad key is named, with the vocabulary's size (Llama 3: 128,256 ids with the added ones).
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x',
    logit_bias: { 999999999: 5, 5: 1, 888888888: 2 } }),
  (e) => e.status === 400 && e.param === 'logit_bias' &&
    /token ids 888888888, 999999999 are not in the vocabulary \(128256 ids, 0 to 128255\)/.test(e.message));
  // Keys that are not ids at all: every one named (vLLM's multiple_non_integer_keys test).
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x',
    logit_bias: { bad1: 50, bad2: 20 } }),
  (e) => e.status === 400 && e.param === 'logit_bias' && /'bad1', 'bad2'/.test(e.message));
  // An out-of-vocabulary stop token id names the vocabulary's size.
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x',
    stop_token_ids: [128256] }),
  (e) => e.status === 400 && e.param === 'stop_token_ids' && /128256 ids/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 0 }),
    (e) => e.status === 400 && e.param === 'max_tokens');
  await assert.rejects(client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'yaml' } }),
  (e) => e.status === 400 && e.param === 'response_format.type');
  const neutral = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'x' }], max_tokens: 2,
    presence_penalty: 0, frequency_penalty: 0, logit_bias: {}, response_format: { type: 'text' } });
  assert.equal(neutral.choices[0].finish_reason, 'length');
});

// vLLM's continue_final_message: the chat is rendered with the final (assistant) message left
// open, so the model continues it; on /tokenize and on chat completions.
test('continue_final_message leaves the final message open', async () => {
  const messages = [{ role: 'user', content: 'Say hi' }, { role: 'assistant', content: 'Hi, I am' }];
  const post = async (body) => (await fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify(body) })).json();
  const detokenize = async (tokens) => (await (await fetch(`${base}/detokenize`, { method: 'POST',
    body: JSON.stringify({ tokens }) })).json()).prompt;
  const open = await post({ messages, continue_final_message: true, add_generation_prompt: false });
  const closed = await post({ messages, add_generation_prompt: false });
  assert.ok((await detokenize(open.tokens)).endsWith('<|start_header_id|>assistant<|end_header_id|>\n\nHi, I am'));
  // (This tokenizer's Llama 3 template always ends with the assistant header.)
  assert.ok((await detokenize(closed.tokens)).includes('Hi, I am<|eot_id|>'));
  assert.deepEqual(closed.tokens.slice(0, open.tokens.length), open.tokens);
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3,
    continue_final_message: true, add_generation_prompt: false });
  assert.equal(r.usage.prompt_tokens, open.count);
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3,
    continue_final_message: true }),
  (e) => e.status === 400 && e.param === 'continue_final_message' && /add_generation_prompt/.test(e.message));
});

// The ids of a text without special tokens, and each id's text.
async function tokenize(text) {
  const r = await fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: text, add_special_tokens: false }) });
  return (await r.json()).tokens;
}

// A completion's tokens (as text) and text, streamed or not, with greedy decoding.
async function complete(params, stream) {
  const body = { model: 'tiny', prompt: 'The router sends each request', max_tokens: 8, temperature: 0, logprobs: 0, ...params };
  if (!stream) {
    const r = await client.completions.create(body);
    const c = r.choices[0];
    return { tokens: c.logprobs.tokens, top: c.logprobs.top_logprobs, text: c.text, finish: c.finish_reason };
  }
  const out = { tokens: [], top: [], text: '', finish: null };
  for await (const chunk of await client.completions.create({ ...body, stream: true })) {
    for (const c of chunk.choices) {
      out.text += c.text;
      out.tokens.push(...(c.logprobs?.tokens ?? []));
      out.top.push(...(c.logprobs?.top_logprobs ?? []));
      out.finish = c.finish_reason ?? out.finish;
    }
  }
  return out;
}

test('logits adjustments: logit_bias, allowed_token_ids, bad_words, min_tokens, penalties', async () => {
  const [the] = await tokenize(' the');
  const [fox, dog] = [(await tokenize(' fox'))[0], (await tokenize(' dog'))[0]];
  assert.equal((await tokenize(' the the fox')).length, 3);  // one token each
  const plain = await complete({}, false);
  for (const stream of [false, true]) {
    const biased = await complete({ logit_bias: { [the]: 100 } }, stream);
    assert.equal(biased.text, ' the'.repeat(8), `stream ${stream}`);
    const allowed = await complete({ allowed_token_ids: [fox, dog], temperature: 1, seed: 5, max_tokens: 24 }, stream);
    assert.deepEqual([...new Set(allowed.tokens)].sort(), [' dog', ' fox'], `stream ${stream}`);
    // The greedy path's first token, banned as a word: it never comes.
    const banned = await complete({ bad_words: [plain.tokens[0].trim()] }, stream);
    assert.ok(!banned.tokens.includes(plain.tokens[0]), JSON.stringify(banned.tokens));
    // A stop string matching the first token ends nothing before min_tokens.
    const early = await complete({ stop: [plain.tokens[0]] }, stream);
    assert.equal(early.text, '');
    const held = await complete({ stop: [plain.tokens[0]], min_tokens: 3 }, stream);
    assert.ok(held.text.startsWith(plain.tokens.slice(0, 3).join('')), JSON.stringify(held));
    // Penalties, exactly: with ' the' and ' fox' the only ids allowed and ' the' biased to win,
    // the processed logprobs give their logit difference at every step; a presence penalty
    // takes 2 from it once ' the' is out, a frequency penalty 1.5 per time.
    const gap = async (params) => {
      const r = await complete({ max_tokens: 3, logprobs: 2, allowed_token_ids: [the, fox], logit_bias: { [the]: 100 },
        ...params }, stream);
      assert.deepEqual(r.tokens, [' the', ' the', ' the']);
      return r.top.map((t) => t[' the'] - t[' fox']);
    };
    const free = await gap({});
    const near = (a, b) => assert.ok(Math.abs(a - b) < 1e-3, `${a} vs ${b}`);
    const presence = await gap({ presence_penalty: 2 });
    [0, 2, 2].forEach((d, i) => near(presence[i], free[i] - d));
    const frequency = await gap({ frequency_penalty: 1.5 });
    [0, 1.5, 3].forEach((d, i) => near(frequency[i], free[i] - d));
  }
  const chat = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
    max_tokens: 3, temperature: 0, logit_bias: { [the]: 100 }, presence_penalty: -2, min_tokens: 3 });
  assert.equal(chat.choices[0].message.content, ' the'.repeat(3));
});

test("a worker started with vLLM's command line serves; priority and --seed as vLLM defines them", async () => {
  const startVllmStyle = async (extra) => {
    const [port, events, metrics, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
    await start(children, path.join(bin, 'kvserve-worker'), [model, '--tensor-parallel-size', '1',
      '--gpu-memory-utilization', '0.9', '--max-model-len', '1024', '--block-size', '16', '--swap-space', '0.01',
      '--max-num-seqs', '8', '--max-num-batched-tokens', '512', '--enable-prefix-caching', '--kv-cache-dtype', 'auto',
      '--enforce-eager', '--served-model-name', 'tiny', '--host', '127.0.0.1', '--port', String(port),
      '--events-port', String(events), '--metrics-port', String(metrics), '--num-gpu-blocks-override', '256', ...extra],
    /kvserve-worker ready/);
    await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
      '--workers', `127.0.0.1:${port}:${events}`, '--max-model-len', '1024'], /kvserve-router ready/);
    for (let i = 0; i < 100 && (await fetch(`http://127.0.0.1:${http}/ready`)).status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 50));
    }
    return new OpenAI({ baseURL: `http://127.0.0.1:${http}/v1`, apiKey: 'unused', maxRetries: 0 });
  };
  const sampled = { model: 'tiny', prompt: 'Seeded by the worker', max_tokens: 6, temperature: 1 };
  const a = await startVllmStyle(['--seed', '7', '--scheduling-policy', 'priority']);
  const first = await a.completions.create(sampled);
  assert.equal(first.usage.completion_tokens, 6);
  const urgent = await a.completions.create({ ...sampled, priority: -5, seed: 1 });
  assert.equal(urgent.usage.completion_tokens, 6);
  // The same --seed, a fresh worker: the same first unseeded sample. (fcfs, the default policy,
  // refuses a priority.)
  const b = await startVllmStyle(['--seed', '7', '--no-enable-prefix-caching']);
  assert.equal((await b.completions.create(sampled)).choices[0].text, first.choices[0].text);
  await assert.rejects(b.completions.create({ ...sampled, priority: 1 }),
    (e) => e.status === 400 && /--scheduling-policy priority/.test(e.message));
  // What cannot hold is refused at start, saying why.
  for (const [args, message] of [
    [['--no-enable-chunked-prefill'], /always prefills prompts in chunks/],
    [[model], /unexpected argument/],
    [['--model', `${model}-other`], /the model is given twice/],
    [['--num-blocks', '64', '--num-gpu-blocks-override', '32'], /disagree/],
    [['--scheduling-policy', 'lifo'], /not one of fcfs, priority/],
  ]) {
    const r = spawnSync(path.join(bin, 'kvserve-worker'), [model, '--port', '0', '--events-port', '0',
      '--metrics-port', '0', ...args], { encoding: 'utf8', timeout: 30000 });
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, message, args.join(' '));
  }
});

// The transformers fixture served whole: its weights with Llama 3's tokenizer (whose first 1024
// ids cover the fixture's vocabulary), prompts sent as token ids.
async function startFixture() {
  const src = new URL('../fixtures/models/tiny-llama3/', import.meta.url).pathname;
  const dir = path.join(tmp, 'fixture');
  fs.mkdirSync(dir, { recursive: true });
  for (const f of ['config.json', 'generation_config.json', 'model.safetensors']) fs.copyFileSync(path.join(src, f), path.join(dir, f));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tokenizerDir, f), path.join(dir, f));
  const [port, events] = await retryOnPortClash(async () => {
    const ports = [await freePort(), await freePort(), await freePort()];
    await start(children, path.join(bin, 'kvserve-worker'), ['--model', dir, '--served-model-name', 'fixture', '--host', '127.0.0.1',
      '--port', String(ports[0]), '--events-port', String(ports[1]), '--metrics-port', String(ports[2]),
      '--max-model-len', '1024', '--num-blocks', '256'], /kvserve-worker ready/);
    return ports;
  });
  const http = await retryOnPortClash(async () => {
    const p = await freePort();
    await start(children, path.join(bin, 'kvserve-router'), ['--model', dir, '--served-model-name', 'fixture', '--host', '127.0.0.1',
      '--port', String(p), '--workers', `127.0.0.1:${port}:${events}`, '--max-model-len', '1024'], /kvserve-router ready/);
    return p;
  });
  for (let i = 0; i < 100 && (await fetch(`http://127.0.0.1:${http}/ready`)).status !== 200; i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  const reference = JSON.parse(fs.readFileSync(path.join(src, 'reference.json'), 'utf8'));
  const logits = readSafetensors(path.join(src, 'reference_logits.safetensors'));
  return { client: new OpenAI({ baseURL: `http://127.0.0.1:${http}/v1`, apiKey: 'unused', maxRetries: 0 }), reference, logits };
}

// log-softmax of row `row` of a [positions, vocab] tensor at `id`, and the largest |logit|.
function logSoftmaxAt(t, row, id) {
  const vocab = t.shape[1];
  const r = t.data.subarray(row * vocab, (row + 1) * vocab);
  let max = -Infinity, scale = 0;
  for (const l of r) { max = Math.max(max, l); scale = Math.max(scale, Math.abs(l)); }
  let sum = 0;
  for (const l of r) sum += Math.exp(l - max);
  return { value: r[id] - max - Math.log(sum), scale, rank: r.filter((l) => l >= r[id]).length };
}

test('echo, prompt_logprobs and lists of prompts (transformers fixture)', async () => {
  const { client: fx, reference, logits } = await startFixture();
  const [short, prompt] = reference.prompts;
  const ref = logits.logits_1;
  // echo + logprobs + max_tokens 0: the prompt scored, nothing generated; each token's logprob is
  // transformers' log-softmax within the fixtures' tolerance (1e-4 of the largest logit, twice).
  const scored = await fx.completions.create({ model: 'fixture', prompt, echo: true, logprobs: 3, max_tokens: 0 });
  const c = scored.choices[0];
  assert.equal(scored.usage.completion_tokens, 0);
  assert.equal(c.finish_reason, 'length');
  assert.equal(c.logprobs.tokens.length, prompt.length);
  assert.equal(c.logprobs.token_logprobs[0], null);
  assert.equal(c.logprobs.top_logprobs[0], null);
  assert.equal(c.text, c.logprobs.tokens.join(''));
  for (let i = 1; i < prompt.length; i++) {
    const want = logSoftmaxAt(ref, i - 1, prompt[i]);
    assert.ok(Math.abs(c.logprobs.token_logprobs[i] - want.value) <= 2e-4 * want.scale, `position ${i}`);
    assert.equal(Object.keys(c.logprobs.top_logprobs[i]).length <= 4, true);
    assert.equal(c.logprobs.top_logprobs[i][c.logprobs.tokens[i]], c.logprobs.token_logprobs[i]);
    assert.equal(c.logprobs.text_offset[i], c.logprobs.tokens.slice(0, i).join('').length);
  }
  // vLLM's prompt_logprobs: {id: {logprob, rank, decoded_token}} with the prompt token and the top 2.
  const vllm = await fx.completions.create({ model: 'fixture', prompt, prompt_logprobs: 2, max_tokens: 1, temperature: 0 });
  const pl = vllm.choices[0].prompt_logprobs;
  assert.equal(pl.length, prompt.length);
  assert.equal(pl[0], null);
  for (let i = 1; i < prompt.length; i++) {
    const want = logSoftmaxAt(ref, i - 1, prompt[i]);
    const got = pl[i][String(prompt[i])];
    assert.ok(Math.abs(got.logprob - want.value) <= 2e-4 * want.scale, `position ${i}`);
    assert.ok(Math.abs(got.rank - want.rank) <= 1, `position ${i} rank ${got.rank} vs ${want.rank}`);
    assert.ok(Object.keys(pl[i]).length <= 3);
  }
  // Streamed echo: the prompt's text and logprobs first, then what is generated.
  let text = '';
  const tokens = [], values = [];
  for await (const chunk of await fx.completions.create({ model: 'fixture', prompt: short, echo: true, logprobs: 1,
    max_tokens: 2, temperature: 0, stream: true })) {
    for (const ch of chunk.choices) {
      text += ch.text;
      tokens.push(...(ch.logprobs?.tokens ?? []));
      values.push(...(ch.logprobs?.token_logprobs ?? []));
    }
  }
  assert.equal(tokens.length, short.length + 2);
  assert.equal(values[0], null);
  assert.equal(text, tokens.join(''));
  // A list of prompts: choices prompt-major then n, each the answer its prompt gets alone.
  const list = await fx.completions.create({ model: 'fixture', prompt: reference.prompts, n: 2, max_tokens: 4, temperature: 0 });
  assert.deepEqual(list.choices.map((ch) => ch.index), [0, 1, 2, 3, 4, 5]);
  let promptTokens = 0;
  for (const [k, p] of reference.prompts.entries()) {
    const alone = await fx.completions.create({ model: 'fixture', prompt: p, max_tokens: 4, temperature: 0 });
    assert.equal(list.choices[2 * k].text, alone.choices[0].text, `prompt ${k}`);
    assert.equal(list.choices[2 * k + 1].text, alone.choices[0].text, `prompt ${k}`);
    promptTokens += p.length;
  }
  assert.equal(list.usage.prompt_tokens, promptTokens);
  assert.equal(list.usage.completion_tokens, 24);
  // Text prompts in a list (the generated model: Llama 3's whole vocabulary), echoed, streamed:
  // each choice starts with its own prompt.
  const texts = ['Hello', 'The fixture'];
  const streamed = ['', ''];
  for await (const chunk of await client.completions.create({ model: 'tiny', prompt: texts, echo: true, max_tokens: 3,
    stream: true })) {
    for (const ch of chunk.choices) streamed[ch.index] += ch.text;
  }
  texts.forEach((t, k) => assert.ok(streamed[k].startsWith(t), JSON.stringify(streamed)));
  await assert.rejects(fx.completions.create({ model: 'fixture', prompt: [short, [5000000]], max_tokens: 1 }),
    (e) => e.status === 400 && /prompt\[1\]: token id 5000000/.test(e.message));
  await assert.rejects(fx.completions.create({ model: 'fixture', prompt, prompt_logprobs: 1, stream: true }),
    (e) => e.status === 400 && e.param === 'prompt_logprobs');
});

// Every choice's text and finish reason, streamed or not, from completions or chat.
async function choicesOf(params, stream) {
  const chat = 'messages' in params;
  const api = chat ? client.chat.completions : client.completions;
  if (!stream) {
    const r = await api.create(params);
    return r.choices.map((c) => ({ text: chat ? c.message.content : c.text, finish: c.finish_reason }));
  }
  const out = Array.from({ length: params.n ?? 1 }, () => ({ text: '', finish: null }));
  for await (const chunk of await api.create({ ...params, stream: true })) {
    for (const c of chunk.choices) {
      out[c.index].text += (chat ? c.delta?.content : c.text) ?? '';
      out[c.index].finish = c.finish_reason ?? out[c.index].finish;
    }
  }
  return out;
}

test('structured outputs: choice and regex constraints, streamed and not', async () => {
  const choices = ['red', 'green', 'dark blue', 'vert foncé'];
  const pattern = String.raw`\d{3}-\d{4}( ext\. [0-9]{1,3})?`;
  const re = new RegExp(`^(?:${pattern})$`);
  for (const stream of [false, true]) {
    const picked = await choicesOf({ model: 'tiny', prompt: 'Pick a color:', max_tokens: 16, temperature: 1, n: 6,
      seed: 3, guided_choice: choices }, stream);
    for (const c of picked) {
      assert.ok(choices.includes(c.text), JSON.stringify(c));
      assert.equal(c.finish, 'stop');
    }
    const phones = await choicesOf({ model: 'tiny', messages: [{ role: 'user', content: 'A phone number?' }],
      max_tokens: 24, temperature: 1, n: 4, seed: 9, structured_outputs: { regex: pattern } }, stream);
    for (const c of phones) {
      assert.match(c.text, re);
      assert.equal(c.finish, 'stop');
    }
  }
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', guided_regex: '(?=a)b' }),
    (e) => e.status === 400 && e.param === 'guided_regex' && /lookaround/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', guided_json: { not: {} } }),
    (e) => e.status === 400 && e.param === 'guided_json' && /'not'/.test(e.message));
});

test('bad HTTP bodies get the right status and an OpenAI error body', async () => {
  const post = (path, body, type = 'application/json') =>
    fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': type }, body });
  const cases = [
    ['/v1/completions', '{not json', 400, 'body'],
    ['/v1/completions', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x7d]), 400, 'body'],  // invalid UTF-8
    ['/v1/completions', JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: -3 }), 400, 'max_tokens'],
    ['/v1/completions', JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 1e12 }), 400, 'max_tokens'],
    ['/v1/chat/completions', JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'x' }], n: 0 }), 400, 'n'],
    ['/v1/chat/completions', JSON.stringify({ model: 'tiny', messages: [{ role: 'wiz<|eot_id|>ard', content: 'x' }] }), 400, 'messages'],
    ['/v1/completions', JSON.stringify({ model: 'other', prompt: 'x' }), 404, null],
  ];
  for (const [path, body, status, param] of cases) {
    const r = await post(path, body);
    assert.equal(r.status, status, String(body));
    const j = await r.json();
    assert.ok(j.error && typeof j.error.message === 'string');
    assert.equal(j.error.param, param);
  }
  const big = await post('/v1/completions', JSON.stringify({ model: 'tiny', prompt: 'x'.repeat(10 << 20) }));
  assert.equal(big.status, 413);
  const missing = await fetch(`${base}/v2/nothing`);
  assert.equal(missing.status, 404);
});

test('tokenize and detokenize, with and without special tokens', async () => {
  const post = async (endpoint, body) =>
    fetch(`${base}${endpoint}`, { method: 'POST', body: JSON.stringify(body) });
  const withBos = await (await post('/tokenize', { prompt: 'Hello there' })).json();
  const without = await (await post('/tokenize', { prompt: 'Hello there', add_special_tokens: false })).json();
  // Without special tokens: the same ids, less whatever the tokenizer's post-processor adds.
  assert.ok(without.count >= 1 && without.count <= withBos.count);
  assert.deepEqual(withBos.tokens.slice(withBos.count - without.count), without.tokens);
  const back = await (await post('/detokenize', { tokens: without.tokens })).json();
  assert.equal(back.prompt, 'Hello there');
  const bad = await post('/tokenize', { prompt: 'x', add_special_tokens: 'no' });
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'add_special_tokens');
  // vLLM's return_token_strs: each id as Hugging Face's tokenizer names it (its getTokens).
  const { Tokenizer } = await import('tokenizers');
  const hf = Tokenizer.fromFile(path.join(tokenizerDir, 'tokenizer.json'));
  const text = 'Hello there,\n  café 日本 <|eot_id|> ok';
  const named = await (await post('/tokenize', { prompt: text, return_token_strs: true })).json();
  const ref = await hf.encode(text, null, { addSpecialTokens: true });
  assert.deepEqual(named.tokens, ref.getIds());
  assert.deepEqual(named.token_strs, ref.getTokens());
  // Not asked for: null, as vLLM's TokenizeResponse has it (not absent).
  assert.strictEqual((await (await post('/tokenize', { prompt: text })).json()).token_strs, null);
  const badStrs = await post('/tokenize', { prompt: 'x', return_token_strs: 'yes' });
  assert.equal((await badStrs.json()).error.param, 'return_token_strs');
});

test('router metrics count requests and routing decisions', async () => {
  const text = await (await fetch(`${base}/metrics`)).text();
  assert.match(text, /kvserve_router_requests_total\{endpoint="\/v1\/completions",status="200"\} [1-9]/);
  assert.match(text, /kvserve_router_requests_total\{endpoint="\/v1\/completions",status="400"\} [1-9]/);
  assert.match(text, /kvserve_router_decisions_total\{reason="prefix"\} [1-9]/);
  assert.match(text, /kvserve_router_prefix_tokens_total\{kind="reported"\}/);
  assert.match(text, /kvserve_router_time_to_first_token_seconds_count [1-9]/);
});

test("the router's /metrics carries its workers' vllm:* families, as vLLM's API port does", async () => {
  const families = (t) => [...t.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]);
  const value = (t, re) => Number((t.match(re) ?? [])[1]);
  const [routerText, workerText] = await Promise.all([fetch(`${base}/metrics`), fetch(workerMetrics)]
    .map(async (r) => (await r).text()));
  const names = families(routerText);
  assert.equal(new Set(names).size, names.length, 'no metric family twice');
  for (const name of ['vllm:num_requests_running', 'vllm:kv_cache_usage_perc', 'vllm:request_success_total',
    'vllm:e2e_request_latency_seconds', 'vllm:prompt_tokens_total', 'kvserve_router_requests_total']) {
    assert.ok(names.includes(name), `${name} on the router's /metrics`);
  }
  assert.match(routerText, /kvserve_router_vllm_metrics_sources\{result="read"\} 1\n/);
  // One worker: the sums are its own counts, labelled with the served model's name, no worker label.
  const stop = /^vllm:request_success_total\{[^}]*finished_reason="stop"[^}]*\} (\S+)$/m;
  const prompt = /^vllm:prompt_tokens_total\{[^}]*\} (\S+)$/m;
  assert.ok(value(routerText, prompt) > 0);
  assert.equal(value(routerText, prompt), value(workerText, prompt));
  assert.equal(value(routerText, stop), value(workerText, stop));
  assert.match(routerText, /^vllm:num_requests_running\{model_name="tiny"\} 0$/m);
  assert.doesNotMatch(routerText.split('\n').filter((l) => l.startsWith('vllm:')).join('\n'), /worker=/);
});

test('a replica that discovers its worker by DNS (--workers-dns localhost:PORT:EVENTS)', async () => {
  const [, port, events] = workerArg.split(':');
  const http = await freePort();
  await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
    '--workers-dns', `localhost:${port}:${events}`, '--dns-refresh-seconds', '1', '--max-model-len', '1024'],
  /kvserve-router: 1\/\d+ workers ready/);  // localhost may also resolve to ::1 (no worker there)
  const other = new OpenAI({ baseURL: `http://127.0.0.1:${http}/v1`, apiKey: 'unused', maxRetries: 0 });
  const c = await other.completions.create({ model: 'tiny', prompt: 'Found by DNS', max_tokens: 3 });
  assert.equal(c.usage.completion_tokens, 3);
  const text = await (await fetch(`http://127.0.0.1:${http}/metrics`)).text();
  assert.match(text, new RegExp(`kvserve_router_routed_total\\{worker="127\\.0\\.0\\.1:${port}:${events}"\\} 1`));
  // A bad target is refused with the flag's name.
  const bad = spawnSync(path.join(bin, 'kvserve-router'), ['--model', model, '--workers-dns', 'localhost:x:1'], { encoding: 'utf8' });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /--workers-dns 'localhost:x:1'/);
});

test('API keys and prompt normalization (a second router replica on the same worker)', async () => {
  const http = await freePort();
  await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
    '--workers', workerArg, '--max-model-len', '1024', '--api-keys', 'k1,k2', '--normalize-prompts'], /kvserve-router ready/);
  const other = `http://127.0.0.1:${http}`;
  const denied = await fetch(`${other}/v1/models`);
  assert.equal(denied.status, 401);
  assert.equal((await denied.json()).error.code, 'invalid_api_key');
  const keyed = new OpenAI({ baseURL: `${other}/v1`, apiKey: 'k2', maxRetries: 0 });
  assert.equal((await keyed.models.list()).data[0].id, 'tiny');
  const tokenize = async (url, messages) =>
    (await (await fetch(`${url}/tokenize`, { method: 'POST', body: JSON.stringify({ messages }) })).json()).tokens;
  const messy = [{ role: 'system', content: 'Be brief.  \n' }, { role: 'user', content: 'cafe\u0301' }];
  const clean = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'caf\u00e9' }];
  assert.deepEqual(await tokenize(other, messy), await tokenize(other, clean));
  assert.notDeepEqual(await tokenize(base, messy), await tokenize(base, clean));  // off by default
});

test('admin API: list, drain (503 with Retry-After), undrain', async () => {
  const http = await freePort();
  await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
    '--workers', workerArg, '--max-model-len', '1024', '--admin-token', 'secret'], /kvserve-router ready/);
  const admin = `http://127.0.0.1:${http}/admin`;
  const auth = { authorization: 'Bearer secret' };
  assert.equal((await fetch(`${admin}/workers`)).status, 401);
  const waitFor = async (pred) => {
    for (let i = 0; i < 200; i++) {
      const list = await (await fetch(`${admin}/workers`, { headers: auth })).json();
      const worker = list.workers[0];  // absent until the core's first snapshot
      if (worker && pred(worker)) return worker;
      await new Promise((r) => setTimeout(r, 25));
    }
    throw new Error('admin state never reached');
  };
  const w = await waitFor((x) => x.state === 'WORKER_STATE_READY');
  assert.equal(w.name, workerArg);
  assert.ok(w.device_blocks.total > 0);
  const drain = await fetch(`${admin}/workers/${workerArg}/drain`, { method: 'POST', headers: auth });
  assert.equal(drain.status, 200);
  await waitFor((x) => x.state === 'WORKER_STATE_DRAINING' && !x.eligible);
  const r = await fetch(`http://127.0.0.1:${http}/v1/completions`, { method: 'POST',
    body: JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 2 }) });
  assert.equal(r.status, 503);
  assert.ok(r.headers.get('retry-after'));
  assert.equal((await fetch(`${admin}/workers/nope/drain`, { method: 'POST', headers: auth })).status, 404);
  assert.equal((await fetch(`${admin}/workers/${workerArg}/explode`, { method: 'POST', headers: auth })).status, 400);
  await fetch(`${admin}/workers/${workerArg}/undrain`, { method: 'POST', headers: auth });
  await waitFor((x) => x.state === 'WORKER_STATE_READY' && x.eligible);
  const ok = await fetch(`http://127.0.0.1:${http}/v1/completions`, { method: 'POST',
    body: JSON.stringify({ model: 'tiny', prompt: 'x', max_tokens: 2 }) });
  assert.equal(ok.status, 200);
});
