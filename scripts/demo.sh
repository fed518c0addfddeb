#!/usr/bin/env bash
# The main job. Today: sets up and builds kvserve, fetches the real Llama 3 tokenizer, makes a
# small random-weight Llama model around it (models/kvserve-tiny-llama3, once), and answers a
# chat request with the engine on the CPU backend: the prompt goes through the Llama 3 chat
# template and tokenizer, the paged-KV engine generates, the tokenizer decodes. The answer is
# random text (random weights); the numbers after it are the engine's cache statistics.
# As the worker server and router land, this grows into a local cluster answering over HTTP.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/fetch-tokenizer.sh
model=models/kvserve-tiny-llama3
if [[ ! -f $model/model.safetensors ]]; then
  build/bin/kvserve-make-model --tokenizer models/llama3-tokenizer --out "$model"
fi
question="Why should a serving engine page its KV cache?"
echo "== request: $question"
build/bin/kvserve-run --model "$model" --chat --prompt "$question" \
  --max-tokens 32 --temperature 0.8 --seed 7 --block-size 16 --max-model-len 4096
