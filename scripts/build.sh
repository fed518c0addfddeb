#!/usr/bin/env bash
# Configures and builds kvserve into build/ (Ninja, -j2: the machines have 2 cores and nvcc is
# memory-hungry). CUDA follows KVSERVE_CUDA (AUTO by default: on when nvcc is found);
# KVSERVE_CUDA_ARCHS picks the architectures (default: the release set; tests use 90);
# KVSERVE_TESTS=OFF leaves the tests out (scripts/demo.sh). Compiles go through ccache when it
# is installed (cmake/KvserveCcache.cmake).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(-S . -B "${KVSERVE_BUILD_DIR:-build}" -G Ninja -DCMAKE_BUILD_TYPE="${KVSERVE_BUILD_TYPE:-RelWithDebInfo}"
      -DKVSERVE_CUDA="${KVSERVE_CUDA:-AUTO}" -DKVSERVE_TESTS="${KVSERVE_TESTS:-ON}")
if [[ -n "${KVSERVE_CUDA_ARCHS:-}" ]]; then
  args+=(-DCMAKE_CUDA_ARCHITECTURES="$KVSERVE_CUDA_ARCHS")
fi
cmake "${args[@]}" >/dev/null
cmake --build "${KVSERVE_BUILD_DIR:-build}" -j "${KVSERVE_JOBS:-2}" "$@"  # e.g. --target NAME
