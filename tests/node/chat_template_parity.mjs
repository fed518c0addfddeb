// Chat template parity: kvserve-tokenize's native llama3 / chatml rendering against the
// tokenizer_config.json's own Jinja template rendered by @huggingface/jinja, on a set of
// conversations (system prompts, multi-turn, reasoning in assistant turns, tool responses,
// whitespace and non-ASCII content, tools and tool calls), with and without a generation
// prompt. Tool-call arguments go to Jinja as objects (vLLM parses them before rendering) and to
// kvserve as the JSON text OpenAI clients send.
//
// A conversation the template refuses (it raises) must be refused by kvserve too.
//
//   node chat_template_parity.mjs BUILD/bin/kvserve-tokenize TOKENIZER_DIR [--template FILE]
//
// --template: render with FILE's template instead of the tokenizer's (tests/node/chat_templates).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Template } from '@huggingface/jinja';
import './lib/jinja_python_strip.mjs';
import { runJsonLines } from './lib/run_tool.mjs';

const [binary, tokenizerDir, flag, templateFile] = process.argv.slice(2);
const config = JSON.parse(fs.readFileSync(path.join(tokenizerDir, 'tokenizer_config.json'), 'utf8'));
let dir = tokenizerDir;
if (flag === '--template') {  // the tokenizer with another template, in a directory of its own
  config.chat_template = fs.readFileSync(templateFile, 'utf8');
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-template-'));
  fs.copyFileSync(path.join(tokenizerDir, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
}
const tokenText = (t) => (typeof t === 'string' ? t : t?.content ?? '');
const template = new Template(config.chat_template);

const u = (content) => ({ role: 'user', content });
const a = (content) => ({ role: 'assistant', content });
const s = (content) => ({ role: 'system', content });
const conversations = [
  [u('Hello!')],
  [s('You are terse.'), u('What is 2+2?')],
  [s('  padded system  \n'), u('\n\nleading newlines'), a('Answer.'), u('Follow-up')],
  [u('Q1'), a('<think>\nreasoning one\n</think>\n\nA1'), u('Q2')],
  [u('Q1'), a('<think>\nr\n</think>\n\nA1'), u('Q2'), a('<think>\nlast reasoning\n</think>\n\nA2')],
  [u('Call a tool'), a('Calling.'), { role: 'tool', content: '{"temp": 21}' }, { role: 'tool', content: 'second' }, u('Thanks')],
  [u('多语言: 日本語、中文、한국어 😀👨‍👩‍👧')],
  [u('tabs\tand\r\nwindows newlines   '), a('  spaced answer  ')],
  [s('A'), s('B second system'), u('C')],
  [u('<tool_response>\nx\n</tool_response>')],
];

const weather = { type: 'function', function: { name: 'get_weather', description: 'Weather in a city, «now».',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer', minimum: 1 } },
    required: ['city'] } } };
const clock = { type: 'function', function: { name: 'now', parameters: { type: 'object', properties: {} } } };
const call = (name, args) => ({ id: `call_${name}`, type: 'function', function: { name, arguments: args } });
const withTools = [
  [[u('Weather in Paris?')], [weather]],
  [[s('You are a helpful agent.'), u('Time and weather?')], [weather, clock]],
  [[u('Weather?'), { role: 'assistant', content: '', tool_calls: [call('get_weather', { city: 'Paris', days: 2 })] },
    { role: 'tool', tool_call_id: 'call_get_weather', content: '{"temp": 21}' }], [weather]],
  [[u('Both'), { role: 'assistant', content: 'Calling two.', tool_calls: [call('now', {}),
    call('get_weather', { city: 'Zürich "quoted"', nested: { list: [1, 2.5, true, null] } })] },
    { role: 'tool', content: '12:00' }, { role: 'tool', content: 'rain' }, u('Thanks')], [weather, clock]],
  [[u('Q'), { role: 'assistant', content: '<think>\nplan\n</think>\n\n', tool_calls: [call('now', {})] },
    { role: 'tool', content: 'noon' }], [clock]],
];
const asSent = (m) => (m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((c) =>
  ({ ...c, function: { ...c.function, arguments: JSON.stringify(c.function.arguments) } })) } : m);

// The template's text, or {error} when it raises.
const render = (ctx) => {
  try {
    return template.render(ctx);
  } catch (e) {
    return { error: e.message };
  }
};

const requests = [];
const expected = [];
for (const messages of conversations) {
  for (const add_generation_prompt of [true, false]) {
    for (const enable_thinking of [undefined, false, true]) {
      const ctx = { messages, add_generation_prompt, bos_token: tokenText(config.bos_token),
        eos_token: tokenText(config.eos_token) };
      if (enable_thinking !== undefined) ctx.enable_thinking = enable_thinking;
      expected.push(render(ctx));
      const req = { messages, add_generation_prompt };
      if (enable_thinking !== undefined) req.enable_thinking = enable_thinking;
      requests.push(req);
    }
  }
}
for (const [messages, tools] of withTools) {
  for (const add_generation_prompt of [true, false]) {
    const ctx = { messages, tools, add_generation_prompt, bos_token: tokenText(config.bos_token),
      eos_token: tokenText(config.eos_token) };
    expected.push(render(ctx));
    requests.push({ messages: messages.map(asSent), tools, add_generation_prompt });
  }
}
const replies = runJsonLines(binary, ['--tokenizer', dir], requests);
let failed = 0;
replies.forEach((r, i) => {
  const same = typeof expected[i] === 'string' ? r.text === expected[i] : r.error !== undefined;
  if (!same) {
    failed++;
    if (failed <= 5) {
      console.log(`MISMATCH #${i} ${JSON.stringify(requests[i]).slice(0, 200)}`);
      console.log(`  ours  ${JSON.stringify(r.text ?? r.error)}`);
      console.log(`  jinja ${JSON.stringify(expected[i])}`);
    }
  }
});
const refused = expected.filter((e) => typeof e !== 'string').length;
console.log(`chat template parity (${templateFile ?? path.basename(path.dirname(tokenizerDir))}, ${refused} refused): ${replies.length - failed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
