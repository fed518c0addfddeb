#!/usr/bin/env bash
# Runs every GPU check on a lent GPU machine from binaries built elsewhere (nothing heavy is
# built there) and prints a summary table last. Build and bundle on the development machine:
#
#   KVSERVE_BUILD_DIR=build-gpu KVSERVE_CUDA=ON KVSERVE_CUDA_ARCHS=90 bash scripts/build.sh
#   ../shared/gpu/bundle-libs.sh build-gpu/libs build-gpu/bin/*
#   cp -r ../shared/fixtures build-gpu/fixtures
#
# then on the GPU machine (carry build-gpu):
#
#   export LD_LIBRARY_PATH=$PWD/build-gpu/libs:/usr/local/cuda/lib64
#   bash tests/gpu/run.sh build-gpu
#
# Today it runs the NCCL communicator test; the CUDA backend issue adds the kernel
# conformance tests and the decode-attention benchmark table.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
export KVSERVE_FIXTURES=${KVSERVE_FIXTURES:-$PWD/$build/fixtures/models}
export KVSERVE_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
results=()
for t in nccl_communicator_test; do
  if [[ ! -x $build/bin/$t ]]; then
    results+=("$t|missing")
    continue
  fi
  start=$(date +%s%N)
  if timeout 120 "$build/bin/$t" >"/tmp/$t.log" 2>&1; then
    grep -q "SKIPPED" "/tmp/$t.log" && r=skipped || r=passed
  else
    r=FAILED
    tail -n 30 "/tmp/$t.log"
  fi
  elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  results+=("$t|$r|$((elapsed_ms / 1000)).$(( (elapsed_ms % 1000) / 100 ))s")
done
echo
printf '%-32s %-8s %s\n' check result time
for row in "${results[@]}"; do IFS='|' read -r name r t <<<"$row"; printf '%-32s %-8s %s\n' "$name" "$r" "${t:-}"; done
