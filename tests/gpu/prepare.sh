#!/usr/bin/env bash
# Builds the GPU checks here (CUDA on, sm_90) in BUILD_DIR (default build) and gathers what the
# GPU machine needs into build-gpu/carry (git ignores it): stripped binaries in bin/, their
# non-system libraries in libs/ (the model fixtures travel with the working tree); then packs it as
# build-gpu/carry.tar.xz (about 20 MiB; the directory is over the 64 MiB a run may carry).
# Carry build-gpu/carry.tar.xz, unpack it there and run tests/gpu/run.sh (see its header).
#
#   bash tests/gpu/prepare.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
targets=(mma_probe_test cuda_backend_test nccl_communicator_test nccl_peer_link_test engine_cuda_test
  engine_cuda_transfer_test decode_attention_bench
  sampling_bench kvserve-bench kvserve-make-model kv_staging_bench)
# A CUDA object whose header dependencies ninja never recorded (seen once here: "#deps 0") is
# not rebuilt when a header changes, and would carry stale kernels: remove such objects first.
if [[ -f $build/build.ninja ]]; then
  for o in $(ninja -C "$build" -t query kernels/libkvserve_kernels_cuda.a 2>/dev/null | grep '\.o$'); do
    if ninja -C "$build" -t deps "$o" | head -1 | grep -q '#deps 0,'; then
      echo "rebuilding $o (no header dependencies recorded)"
      rm -f "$build/$o"
    fi
  done
fi
KVSERVE_BUILD_DIR=$build KVSERVE_CUDA=ON KVSERVE_CUDA_ARCHS=90 bash scripts/build.sh --target "${targets[@]}"
rm -rf build-gpu/carry
mkdir -p build-gpu/carry/bin
for b in "${targets[@]}"; do strip -o "build-gpu/carry/bin/$b" "$build/bin/$b"; done
bash tests/gpu/bundle-libs.sh build-gpu/carry/libs build-gpu/carry/bin/*
du -sh build-gpu/carry
tar -C build-gpu -cf - carry | xz -T2 -6 >build-gpu/carry.tar.xz
ls -la build-gpu/carry.tar.xz
