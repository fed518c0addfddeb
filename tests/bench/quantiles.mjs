// Quantiles of a Prometheus histogram over an interval: the bucket counts of AFTER less those
// of BEFORE (two scrapes of /metrics), linearly interpolated within the bucket, as Prometheus's
// histogram_quantile does. Prints "p50 p99" in milliseconds.
//
//   node quantiles.mjs BEFORE.txt AFTER.txt METRIC 'stage="to_worker"'
import fs from 'node:fs';

const [beforeFile, afterFile, metric, label] = process.argv.slice(2);

function buckets(file) {
  const out = new Map();
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line.startsWith(`${metric}_bucket{`) || !line.includes(label)) continue;
    const le = /le="([^"]+)"/.exec(line)[1];
    out.set(le === '+Inf' ? Infinity : Number(le), Number(line.split(' ').pop()));
  }
  return out;
}

const before = buckets(beforeFile);
const after = buckets(afterFile);
const bounds = [...after.keys()].sort((a, b) => a - b);
const counts = bounds.map((b) => after.get(b) - (before.get(b) ?? 0));
const total = counts.at(-1);
const quantile = (q) => {
  if (total === 0) return NaN;
  const rank = q * total;
  for (let i = 0; i < bounds.length; i++) {
    if (counts[i] < rank) continue;
    const lower = i === 0 ? 0 : bounds[i - 1];
    const below = i === 0 ? 0 : counts[i - 1];
    if (bounds[i] === Infinity) return lower;
    return lower + (bounds[i] - lower) * ((rank - below) / Math.max(1, counts[i] - below));
  }
  return bounds.at(-2);
};
console.log(`${(quantile(0.5) * 1000).toFixed(3)} ${(quantile(0.99) * 1000).toFixed(3)}`);
