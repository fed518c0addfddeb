// nginx (Debian's) as the load balancer in front of two kvserve-router replicas sharing one
// CPU worker: the official `openai` client through nginx gets chat and completions, streamed
// (several SSE chunks, not one buffered body) and not, and nginx spreads requests over both
// replicas. Skipped (exit 0 with a notice) when nginx is not installed; scripts/install-deps.sh
// installs nginx-light.
//
//   node nginx_test.mjs BUILD_BIN_DIR TOKENIZER_DIR
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import OpenAI from 'openai';

import { freePort, makeModel, startAndWait as start } from './lib/harness.mjs';

const [bin, tokenizerDir] = process.argv.slice(2);
const nginx = ['/usr/sbin/nginx', '/usr/bin/nginx'].find((p) => fs.existsSync(p));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvserve-nginx-'));
const model = path.join(tmp, 'tiny');
const children = [];
const routers = [];
let client;



async function routerRequests(port) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  let n = 0;
  for (const m of text.matchAll(/kvserve_router_requests_total\{endpoint="\/v1\/[^"]*",status="200"\} (\d+)/g)) n += Number(m[1]);
  return n;
}

before(async () => {
  if (!nginx) return;
  makeModel(bin, tokenizerDir, model);
  const [port, events, metrics] = [await freePort(), await freePort(), await freePort()];
  await start(children, path.join(bin, 'kvserve-worker'), ['--model', model, '--host', '127.0.0.1', '--port', String(port),
    '--events-port', String(events), '--metrics-port', String(metrics), '--max-model-len', '1024', '--num-blocks', '512'],
  /kvserve-worker ready/);
  for (let i = 0; i < 2; i++) {
    const http = await freePort();
    await start(children, path.join(bin, 'kvserve-router'), ['--model', model, '--host', '127.0.0.1', '--port', String(http),
      '--workers', `127.0.0.1:${port}:${events}`, '--max-model-len', '1024'], /kvserve-router: 1\/1 workers ready/);
    routers.push(http);
  }
  const listen = await freePort();
  fs.mkdirSync(path.join(tmp, 'nginx'));
  const conf = path.join(tmp, 'nginx', 'nginx.conf');
  const temp = path.join(tmp, 'nginx');
  fs.writeFileSync(conf, `
${process.getuid && process.getuid() === 0 ? 'user root;' : ''}
worker_processes 1;
daemon off;
pid ${temp}/nginx.pid;
error_log stderr notice;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path ${temp}/body;
  proxy_temp_path ${temp}/proxy;
  fastcgi_temp_path ${temp}/fastcgi;
  uwsgi_temp_path ${temp}/uwsgi;
  scgi_temp_path ${temp}/scgi;
  upstream kvserve {
    server 127.0.0.1:${routers[0]};
    server 127.0.0.1:${routers[1]};
    keepalive 16;
  }
  server {
    listen 127.0.0.1:${listen};
    location / {
      proxy_pass http://kvserve;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;            # stream server-sent events as they come
      proxy_read_timeout 300s;
    }
  }
}
`);
  await start(children, nginx, ['-p', temp, '-c', conf], /start worker process/);
  client = new OpenAI({ baseURL: `http://127.0.0.1:${listen}/v1`, apiKey: 'unused', maxRetries: 0 });
});

after(() => {
  for (const c of children) c.kill('SIGTERM');
  fs.rmSync(tmp, { recursive: true, force: true });
});

test('through nginx: streaming chat arrives in chunks, completions, both replicas serve', async (t) => {
  if (!nginx) {
    t.skip('nginx is not installed (scripts/install-deps.sh installs nginx-light)');
    return;
  }
  const chunks = [];
  const stream = await client.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 24, stream: true,
    stream_options: { include_usage: true }, ignore_eos: true,
  });
  for await (const c of stream) chunks.push(c);
  const content = chunks.filter((c) => c.choices.length && c.choices[0].delta.content);
  assert.ok(content.length >= 2, `expected several streamed deltas, got ${content.length}`);
  assert.equal(chunks.at(-1).usage.completion_tokens, 24);
  const before = await Promise.all(routers.map(routerRequests));
  for (let i = 0; i < 6; i++) {
    const c = await client.completions.create({ model: 'tiny', prompt: `Request ${i}`, max_tokens: 3 });
    assert.equal(c.usage.completion_tokens, 3);
  }
  const afterCounts = await Promise.all(routers.map(routerRequests));
  const served = afterCounts.map((n, i) => n - before[i]);
  assert.equal(served[0] + served[1], 6);
  assert.ok(served[0] > 0 && served[1] > 0, `nginx should use both replicas: ${served}`);
});
