// What prompt_logprobs costs (docs/PERF.md): a worker and a router on the generated model (Llama
// 3's 128K vocabulary), one 500-token prompt sent as ids, requests timed end to end at the client
// one at a time, the variants interleaved round by round:
//   cold         max_tokens 1, the prompt's first token changed each round (no prefix hit)
//   cached       max_tokens 1, the same prompt (every full block a prefix-cache hit)
//   scored 0     prompt_logprobs 0 on the same prompt (recomputed: every position's logits)
//   scored 5     prompt_logprobs 5
//   echo 5       echo + logprobs 5 + max_tokens 0 (what evaluation harnesses send)
//
//   node tests/bench/prompt_logprobs_cost.mjs BUILD_BIN_DIR TOKENIZER_DIR [ROUNDS] > table.md
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { freePort, makeModel, startAndWait } from '../node/harness.mjs';

const [bin, tokenizer, rounds = '15'] = process.argv.slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-prompt-logprobs-'));
const children = [];
const cleanup = () => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
};
try {
  const model = path.join(tmp, 'model');
  makeModel(bin, tokenizer, model);
  const [port, events, metrics, http] = [await freePort(), await freePort(), await freePort(), await freePort()];
  await startAndWait(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--served-model-name', 'm',
    '--host', '127.0.0.1', '--port', String(port), '--events-port', String(events), '--metrics-port', String(metrics),
    '--max-model-len', '1024', '--num-blocks', '1024'], /kvserve-worker ready/);
  await startAndWait(children, path.join(bin, 'kvserve-router'), ['--model', model, '--served-model-name', 'm',
    '--host', '127.0.0.1', '--port', String(http), '--workers', `127.0.0.1:${port}:${events}`, '--max-model-len', '1024'],
  /kvserve-router ready/);
  const url = `http://127.0.0.1:${http}`;
  while ((await fetch(`${url}/ready`)).status !== 200) await new Promise((r) => setTimeout(r, 50));
  const prompt = Array.from({ length: 500 }, (_, i) => 1000 + ((i * 7919) % 100000));
  const post = async (body) => {
    const t0 = performance.now();
    const r = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', temperature: 0, max_tokens: 1, ...body }) });
    const j = await r.json();
    if (r.status !== 200) throw new Error(JSON.stringify(j));
    return performance.now() - t0;
  };
  const variants = {
    cold: (k) => ({ prompt: [2000 + k, ...prompt.slice(1)] }),
    cached: () => ({ prompt }),
    'scored 0': () => ({ prompt, prompt_logprobs: 0 }),
    'scored 5': () => ({ prompt, prompt_logprobs: 5 }),
    'echo 5': () => ({ prompt, echo: true, logprobs: 5, max_tokens: 0 }),
  };
  const times = Object.fromEntries(Object.keys(variants).map((v) => [v, []]));
  await post(variants.cached());  // the prompt's blocks cached
  for (let k = 0; k < Number(rounds); k++) {
    for (const [name, body] of Object.entries(variants)) times[name].push(await post(body(k)));
  }
  const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  const cold = median(times.cold);
  console.log(`| variant (500-token prompt, ${rounds} rounds) | median ms | × cold | × cached |`);
  console.log('|---|---|---|---|');
  for (const name of Object.keys(variants)) {
    const m = median(times[name]);
    console.log(`| ${name} | ${m.toFixed(1)} | ${(m / cold).toFixed(2)} | ${(m / median(times.cached)).toFixed(2)} |`);
  }
} finally {
  cleanup();
}
