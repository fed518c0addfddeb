// Runs a kvserve JSON-lines tool once over many requests and returns the parsed replies.
import { spawnSync } from 'node:child_process';

export function runJsonLines(binary, args, requests) {
  const input = requests.map((r) => JSON.stringify(r)).join('\n') + '\n';
  const res = spawnSync(binary, args, { input, maxBuffer: 1 << 30, encoding: 'utf8' });
  if (res.status !== 0) {
    throw new Error(`${binary} exited with ${res.status}: ${res.stderr}`);
  }
  const lines = res.stdout.split('\n').filter((l) => l.length > 0);
  if (lines.length !== requests.length) {
    throw new Error(`${binary}: ${lines.length} replies for ${requests.length} requests`);
  }
  return lines.map((l) => JSON.parse(l));
}
