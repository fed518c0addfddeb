// Hugging Face `tokenizers` encode throughput on a JSON-lines corpus, single thread
// (RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false must be set by the caller), two ways:
//   per_call: one awaited encode() per string, as a server encoding requests would;
//   batch:    one encodeBatch() over the whole corpus (amortizes the N-API call cost).
// Also writes the corpus itself with --write-corpus.
//
//   node tokenizer_bench.mjs --write-corpus OUT.jsonl [COUNT]
//   node tokenizer_bench.mjs TOKENIZER_DIR CORPUS.jsonl [SECONDS]
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from 'tokenizers';
import { makeCorpus } from './lib/corpus.mjs';

const args = process.argv.slice(2);
if (args[0] === '--write-corpus') {
  const corpus = makeCorpus({ seed: 20261129, count: Number(args[2] ?? 2400),
    specials: ['<|begin_of_text|>', '<|eot_id|>', '<|im_start|>', '<|im_end|>'] });
  fs.writeFileSync(args[1], corpus.map((text) => JSON.stringify({ text })).join('\n') + '\n');
  process.exit(0);
}
const [dir, corpusPath, secondsArg] = args;
const seconds = Number(secondsArg ?? 3);
const corpus = fs.readFileSync(corpusPath, 'utf8').trim().split('\n').map((l) => JSON.parse(l).text);
const bytes = corpus.reduce((n, s) => n + Buffer.byteLength(s, 'utf8'), 0);
const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));

async function measure(pass) {
  await pass();  // warm-up
  let passes = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < seconds) {
    await pass();
    passes++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  }
  return { passes, seconds: elapsed, mb_per_s: (bytes * passes) / elapsed / 1e6, ms_per_pass: (elapsed * 1e3) / passes };
}

let tokens = 0;
const perCall = await measure(async () => {
  tokens = 0;
  for (const s of corpus) tokens += (await tok.encode(s, null, { addSpecialTokens: true })).getIds().length;
});
const batch = await measure(async () => {
  await tok.encodeBatch(corpus, { addSpecialTokens: true });
});
console.log(JSON.stringify({ strings: corpus.length, bytes, tokens, per_call: perCall, batch }));
