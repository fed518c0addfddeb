#!/usr/bin/env bash
# The main job. Today: sets up and builds kvserve, fetches the real Llama 3 tokenizer and runs
# kvserve-tokenize on a chat request (rendered with the Llama 3 chat template) and back.
# As the engine, worker and router land, this grows into a local cluster answering the request.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/fetch-tokenizer.sh
tok=models/llama3-tokenizer
echo "== kvserve-tokenize: a chat request with the Llama 3 template"
printf '%s\n' \
  '{"messages": [{"role": "system", "content": "You are kvserve."}, {"role": "user", "content": "Why page the KV cache? 页面 🚀"}]}' |
  build/bin/kvserve-tokenize --tokenizer "$tok" | tee /tmp/kvserve-demo.json
ids=$(sed -e 's/.*"ids":\(\[[^]]*\]\).*/\1/' /tmp/kvserve-demo.json)
echo "== and back to text"
printf '{"ids": %s}\n' "$ids" | build/bin/kvserve-tokenize --tokenizer "$tok"
