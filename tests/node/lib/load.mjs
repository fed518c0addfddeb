// Steady load against a router for the reliability runs (chaos_test.mjs, soak.mjs): concurrent
// clients, each sending chat completions one after another, streamed or not, some abandoned
// midway, and sorting every outcome:
//   ok        the answer came whole: `max_tokens` tokens (ignore_eos), counted one by one from
//             the stream's logprob entries, [DONE] last; or a whole non-streamed answer
//   clean     a refusal or failure the client can act on: an OpenAI error body with its status
//             (429, 503, 504, ...), or a stream that ends with an error event and [DONE]
//   cut       the connection ended or reset before the answer's end (no [DONE]): the client
//             knows it failed, not why (a router killed with SIGKILL)
//   refused   the connection failed (the router was down)
//   abandoned the client went away on purpose (a disconnect test)
//   hung      no end within `hangMs` (must be 0)
//   lost      claimed success with fewer tokens than asked (must be 0)
import http from 'node:http';

export const OUTCOMES = ['ok', 'clean', 'cut', 'refused', 'abandoned', 'hung', 'lost'];

// One request over a fresh connection; resolves with its outcome and a note.
function one(url, body, { abandonAfterMs = 0, hangMs = 60000 } = {}) {
  return new Promise((resolve) => {
    let settled = false;
    const done = (outcome, note = '') => {
      if (settled) return;
      settled = true;
      clearTimeout(hangTimer);
      resolve({ outcome, note });
    };
    const req = http.request(`${url}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, agent: false,
    });
    const hangTimer = setTimeout(() => { req.destroy(); done('hung', body.messages[0].content); }, hangMs);
    if (abandonAfterMs > 0) setTimeout(() => { req.destroy(); done('abandoned'); }, abandonAfterMs);
    req.on('error', (e) => done(e.code === 'ECONNREFUSED' ? 'refused' : 'cut', String(e)));
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('error', () => {});
      res.on('end', () => done(...judge(res, text, body)));
      res.on('aborted', () => done('cut', 'response aborted'));
    });
    req.end(JSON.stringify(body));
  });
}

// The outcome of a response that ended.
function judge(res, text, body) {
  if (res.statusCode !== 200) {
    try {
      const e = JSON.parse(text).error;
      if (e && e.message) return ['clean', `${res.statusCode} ${e.message}`];
    } catch { /* not JSON: below */ }
    return ['cut', `${res.statusCode} without an error body: ${text.slice(0, 200)}`];
  }
  if (!body.stream) {
    let answer;
    try { answer = JSON.parse(text); } catch { return ['cut', 'a 200 whose body is cut']; }
    const tokens = answer.usage?.completion_tokens;
    return tokens === body.max_tokens ? ['ok'] : ['lost', `${tokens} of ${body.max_tokens} tokens`];
  }
  const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  if (events.at(-1) !== '[DONE]') return ['cut', 'a stream cut before [DONE]'];
  let tokens = 0;
  for (const e of events.slice(0, -1)) {
    const chunk = JSON.parse(e);
    if (chunk.error) return ['clean', `stream error: ${chunk.error.message}`];
    for (const c of chunk.choices ?? []) tokens += c.logprobs?.content?.length ?? 0;
  }
  return tokens === body.max_tokens ? ['ok'] : ['lost', `${tokens} of ${body.max_tokens} streamed tokens`];
}

// Runs `clients` loops of requests until stop() is called; `counts` tallies outcomes and
// `notes` keeps the first few of each (for the report). abandonEvery > 0: every Nth request of
// a client is dropped midway.
export function startLoad(url, { clients = 4, maxTokens = 16, abandonEvery = 0, hangMs = 60000 } = {}) {
  const counts = Object.fromEntries(OUTCOMES.map((o) => [o, 0]));
  const notes = Object.fromEntries(OUTCOMES.map((o) => [o, []]));
  const latencies = [];
  let stopping = false;
  let sent = 0;
  const loop = async (client) => {
    for (let i = 0; !stopping; i++) {
      const stream = (i + client) % 2 === 0;
      const body = {
        model: 'tiny', max_tokens: maxTokens, ignore_eos: true, stream, logprobs: true,
        messages: [{ role: 'user', content: `client ${client} request ${i}: tell me something` }],
      };
      const abandon = abandonEvery > 0 && i % abandonEvery === abandonEvery - 1;
      sent++;
      const t0 = Date.now();
      const { outcome, note } = await one(url, body, { abandonAfterMs: abandon ? 5 + (i % 50) : 0, hangMs });
      counts[outcome]++;
      if (outcome === 'ok') latencies.push(Date.now() - t0);
      if (note && notes[outcome].length < 3) notes[outcome].push(note);
      if (outcome === 'refused') await new Promise((r) => setTimeout(r, 50));  // router down
    }
  };
  const running = Array.from({ length: clients }, (_, c) => loop(c));
  return {
    counts, notes, latencies,
    sent: () => sent,
    // Stops sending; resolves once every request under way has ended.
    stop: async () => { stopping = true; await Promise.all(running); },
  };
}

export function percentile(values, p) {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}
