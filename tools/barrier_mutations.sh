#!/bin/bash
# Whether the emulation tests would notice each __syncthreads of a kernel source missing: removes
# them one at a time, rebuilds TEST in BUILD_DIR (a CUDA build: the emulation tests are built
# with it) and runs it in each of the emulator's thread orders (KVSERVE_EMULATED_THREAD_ORDER,
# tests/testing/cuda_emulator/emulator.h). A barrier whose removal passes in every order is either
# redundant (another barrier already separates the accesses) or a gap in the test's cases.
# The source is restored after each removal, and on exit.
#
#   tools/barrier_mutations.sh FILE TEST [BUILD_DIR]
#   tools/barrier_mutations.sh kernels/cuda/ops/sampling.cuh sampling_emulation_test
#   GTEST_FILTER='*KvWriteMatchesCpu*' tools/barrier_mutations.sh kernels/cuda/ops/kv_write.cu \
#     cuda_backend_test build-emulated      # an emulated build (KVSERVE_CUDA=EMULATED)
set -euo pipefail
file=$1
test=$2
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
build=${3:-$root/build}
cd "$root"
backup=$(mktemp)
cp "$file" "$backup"
trap 'cp "$backup" "$file"; rm -f "$backup"' EXIT
orders=(forward reverse warps warps-reverse)
printf '%-40s' "line"
printf ' %-14s' "${orders[@]}"
echo
for line in $(grep -n "__syncthreads();" "$backup" | cut -d: -f1); do
  cp "$backup" "$file"
  sed -i "${line}s/__syncthreads();/\/* removed *\//" "$file"
  printf '%-40s' "$(basename "$file"):$line"
  if ! ninja -C "$build" "$test" >/dev/null 2>&1; then
    echo " build failed"
    continue
  fi
  for order in "${orders[@]}"; do
    log=$(KVSERVE_SOURCE_DIR=$root KVSERVE_EMULATED_THREAD_ORDER=$order timeout 600 \
      "$build/bin/$test" 2>&1 || true)
    if grep -q '^\[  PASSED  \]' <<<"$log" && ! grep -q '^\[  FAILED  \]' <<<"$log"; then
      r=passed
    elif grep -q '^\[  FAILED  \]' <<<"$log"; then
      r=FAILED
    else
      r=crashed
    fi
    printf ' %-14s' "$r"
  done
  echo
done
cp "$backup" "$file"
ninja -C "$build" "$test" >/dev/null
