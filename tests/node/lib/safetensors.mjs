// Minimal safetensors reader for tests (F32 tensors only).
import fs from 'node:fs';

export function readSafetensors(path) {
  const buf = fs.readFileSync(path);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const base = 8 + headerLen;
  const out = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    if (t.dtype !== 'F32') throw new Error(`${name}: only F32 is supported here`);
    const [b, e] = t.data_offsets;
    const data = new Float32Array(buf.buffer.slice(buf.byteOffset + base + b, buf.byteOffset + base + e));
    out[name] = { shape: t.shape, data };
  }
  return out;
}
