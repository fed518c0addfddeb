// Generates common/testdata/block_hash_vectors.json independently of the C++ code: the byte
// layout of common/kv/BLOCK_HASH.md is built here in JavaScript and hashed with the `xxhsum -H2`
// command-line tool (Debian package `xxhash`, XXH3-128 with seed 0).
//
//   node tools/gen_block_hash_vectors.mjs > common/testdata/block_hash_vectors.json
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

function u16(v) { const b = Buffer.alloc(2); b.writeUInt16LE(v); return b; }
function u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0); return b; }
function str(s) { const b = Buffer.from(s, 'utf8'); return Buffer.concat([u16(b.length), b]); }

function extraKey(k) {
  return Buffer.concat([Buffer.from('KVS1'), str(k.model_id), str(k.kv_cache_dtype), str(k.kv_quant),
    u32(k.block_size), u32(k.tensor_parallel_size), str(k.cache_salt)]);
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'bhv-'));
function xxh128(bytes) {
  const f = path.join(tmp, 'in.bin');
  fs.writeFileSync(f, bytes);
  const out = execFileSync('xxhsum', ['-H2', f], { encoding: 'utf8' });
  // xxhsum prints the canonical (big-endian) form; the contract's byte form is little-endian.
  const be = Buffer.from(out.trim().split(/\s+/)[0].replace(/^XXH128_/, ''), 'hex');
  return Buffer.from(be).reverse();
}

function vector(name, key, tokens) {
  const ek = extraKey(key);
  const blocks = [];
  let parent = Buffer.alloc(16);
  for (let start = 0; start + key.block_size <= tokens.length; start += key.block_size) {
    const input = Buffer.concat([parent, ...tokens.slice(start, start + key.block_size).map(u32), ek]);
    parent = xxh128(input);
    blocks.push({ input_hex: input.toString('hex'), hash_hex: parent.toString('hex') });
  }
  return { name, cache_key: key, extra_key_hex: ek.toString('hex'), tokens, blocks };
}

const base = { model_id: 'tiny-llama3', kv_cache_dtype: 'fp32', kv_quant: '', block_size: 4,
  tensor_parallel_size: 1, cache_salt: '' };
const seq = Array.from({ length: 18 }, (_, i) => (i * 7919 + 13) % 1024);
const vectors = [
  vector('basic: 4 full blocks and a partial one', base, seq),
  vector('one token changed in block 2', base, seq.map((t, i) => (i === 9 ? t + 1 : t))),
  vector('cache salt set', { ...base, cache_salt: 'tenant-a' }, seq),
  vector('kv dtype int8 per-group', { ...base, kv_cache_dtype: 'int8', kv_quant: 'per_group:128' }, seq),
  vector('block size 16, large ids', { ...base, block_size: 16, model_id: 'meta-llama/Meta-Llama-3-8B' },
    Array.from({ length: 35 }, (_, i) => 128000 + i * 3)),
  vector('tensor parallel 4, unicode model id', { ...base, tensor_parallel_size: 4, model_id: 'qwen3-模型' }, seq),
  vector('max uint32 token', { ...base, block_size: 2 }, [0, 4294967295, 1, 2]),
  vector('no full block', base, [1, 2, 3]),
];
fs.rmSync(tmp, { recursive: true });
process.stdout.write(JSON.stringify({
  spec: 'common/kv/BLOCK_HASH.md',
  generator: 'tools/gen_block_hash_vectors.mjs (xxhsum -H2)',
  vectors,
}, null, 1) + '\n');
