// The include graph between the source folders runs one way (docs/ARCHITECTURE.md, "Layers"):
// - every folder and sub-folder is a node; a file's #include "a/b/c.h" of another folder's
//   header is an edge from its folder to that one. The graph has no cycle, so no include runs
//   back up (a sub-folder that includes its parent, whose files include the sub-folder, is one);
// - the top-level folders form layers, and a folder includes only its own layer's folders or
//   lower ones: a layer's folders are independent of each other unless listed as allowed.
// A binary's main.cc is its entry point, above every folder: it is left out. Folders, files and
// edges are counted, so that an extraction that finds nothing fails.
//
//   node include_graph_test.mjs SOURCE_DIR
import fs from 'node:fs';
import path from 'node:path';

// Lowest first. tests/ and tools/ sit above everything and are not checked.
const kLayers = [
  ['common'],
  ['proto'],
  ['kernels', 'frontend', 'upstream'],
  ['epp'],
  ['worker', 'router'],
];
// Includes between folders of one layer that are allowed (from a folder to one it builds on).
const kSameLayer = new Set(['kernels->kernels']);

const root = process.argv[2];
if (!root) {
  console.error('usage: include_graph_test.mjs SOURCE_DIR');
  process.exit(2);
}
const layerOf = new Map();
kLayers.forEach((folders, i) => folders.forEach((f) => layerOf.set(f, i)));

// Every source file under the layered folders: its folder and the project headers it includes.
function* sources(dir) {
  for (const e of fs.readdirSync(path.join(root, dir), {withFileTypes: true})) {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) {
      yield* sources(rel);
    } else if (/\.(h|cc|cu|cuh)$/.test(e.name) && e.name !== 'main.cc') {
      yield rel;
    }
  }
}
const edges = new Map();  // folder -> Map(folder it includes -> an example "file: header")
let files = 0;
for (const top of layerOf.keys()) {
  for (const file of sources(top)) {
    ++files;
    const from = path.dirname(file);
    if (!edges.has(from)) edges.set(from, new Map());
    const text = fs.readFileSync(path.join(root, file), 'utf8');
    for (const m of text.matchAll(/^\s*#\s*include\s+"([^"]+)"/gm)) {
      const header = m[1];
      const to = path.dirname(header);
      if (to === '.' || to === from || !fs.existsSync(path.join(root, header))) continue;
      if (!edges.get(from).has(to)) edges.get(from).set(to, `${file}: ${header}`);
    }
  }
}
const failures = [];
let count = 0;
for (const [from, tos] of edges) {
  for (const [to, example] of tos) {
    ++count;
    const a = from.split('/')[0];
    const b = to.split('/')[0];
    if (!layerOf.has(b) || a === b) continue;
    const la = layerOf.get(a);
    const lb = layerOf.get(b);
    if (lb > la || (lb === la && !kSameLayer.has(`${a}->${b}`))) {
      failures.push(`${a}/ (layer ${la}) includes ${b}/ (layer ${lb}): ${example}`);
    }
  }
}
// Cycles: a depth-first search over the folders, reporting each back edge with its path.
const state = new Map();  // folder -> 'open' | 'done'
const stack = [];
function visit(f) {
  state.set(f, 'open');
  stack.push(f);
  for (const [to, example] of edges.get(f) ?? []) {
    if (state.get(to) === 'open') {
      const cycle = stack.slice(stack.indexOf(to)).concat(to).join(' -> ');
      failures.push(`include cycle ${cycle} (closed by ${example})`);
    } else if (!state.has(to)) {
      visit(to);
    }
  }
  stack.pop();
  state.set(f, 'done');
}
for (const f of [...edges.keys()].sort()) if (!state.has(f)) visit(f);

if (files < 100 || edges.size < 15 || count < 30) {
  console.error(`found only ${files} files, ${edges.size} folders, ${count} edges: ` +
                'is the extraction broken?');
  process.exit(1);
}
for (const f of failures) console.log(f);
console.log(`${files} files in ${edges.size} folders, ${count} edges between them: ` +
            `${failures.length} failed`);
process.exit(failures.length === 0 ? 0 : 1);
