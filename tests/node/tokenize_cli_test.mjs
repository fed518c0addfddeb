// kvserve-tokenize as a user drives it: JSON lines in and out, one bad line does not stop the
// stream, bad flags and unloadable tokenizers exit non-zero with a one-line reason.
//
//   node tokenize_cli_test.mjs BUILD/bin/kvserve-tokenize LLAMA3_TOKENIZER_DIR
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';

const [binary, dir] = process.argv.slice(2);

function run(args, input) {
  return spawnSync(binary, args, { input, encoding: 'utf8' });
}

test('encodes, decodes and renders, one reply per line', () => {
  const lines = [
    { text: 'Hello world' },
    'not json',
    { ids: [9906, 1917] },
    { ids: [128000, 9906], skip_special_tokens: true },
    { ids: [9906, 'x'] },
    { ids: [1 << 30] },
    { text: 5 },
    { nothing: true },
    { messages: [{ role: 'user', content: 'Hi' }] },
    { messages: [{ role: 'ro bot', content: 'Hi' }] },
    { text: '<|eot_id|>', add_special_tokens: false },
  ].map((l) => (typeof l === 'string' ? l : JSON.stringify(l)));
  lines.push('{"text": "\\ud800"}');  // a lone surrogate escape is not valid text
  const res = run(['--tokenizer', dir], lines.join('\n') + '\n');
  assert.equal(res.status, 0, res.stderr);
  const out = res.stdout.trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(out.length, lines.length);
  assert.deepEqual(out[0], { ids: [9906, 1917] });
  assert.match(out[1].error, /not a JSON object/);
  assert.deepEqual(out[2], { text: 'Hello world' });
  assert.deepEqual(out[3], { text: 'Hello' });
  assert.match(out[4].error, /32-bit integers/);
  assert.match(out[5].error, /1073741824 is not in the vocabulary/);
  assert.match(out[6].error, /'text' must be a string/);
  assert.match(out[7].error, /needs 'text', 'ids' or 'messages'/);
  assert.equal(out[8].text, '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>' +
    '<|start_header_id|>assistant<|end_header_id|>\n\n');
  assert.equal(out[8].ids[0], 128000);
  assert.match(out[9].error, /role: a custom role is a name/);
  assert.deepEqual(out[10], { ids: [128009] });
  assert.ok(out[11].error);
});

test('bad flags and missing files exit non-zero with a reason', () => {
  let res = run(['--tokenizer', '/nonexistent-dir'], '');
  assert.notEqual(res.status, 0);
  assert.match(res.stderr, /nonexistent-dir\/tokenizer.json/);
  res = run([], '');
  assert.notEqual(res.status, 0);
  assert.match(res.stderr, /--tokenizer DIR is required/);
  res = run(['--no-such-flag'], '');
  assert.notEqual(res.status, 0);
  assert.match(res.stderr, /no_such_flag/);
  res = run(['--help'], '');
  assert.match(res.stdout + res.stderr, /--tokenizer/);
});
