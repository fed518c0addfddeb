#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/ops/copy_blocks.h"

namespace kvserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One thread block per segment: 16-byte words when both ends are aligned, bytes otherwise.
__global__ void CopySegmentsKernel(const CopySegment* segments) {
  const CopySegment s = segments[blockIdx.x];
  const bool aligned = ((reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst) |
                         static_cast<uintptr_t>(s.bytes)) &
                        15) == 0;
  if (aligned) {
    const uint4* src = reinterpret_cast<const uint4*>(s.src);
    uint4* dst = reinterpret_cast<uint4*>(s.dst);
    for (int64_t i = threadIdx.x; i < s.bytes / 16; i += blockDim.x) dst[i] = src[i];
  } else {
    for (int64_t i = threadIdx.x; i < s.bytes; i += blockDim.x) s.dst[i] = s.src[i];
  }
}

}  // namespace

void LaunchCopySegments(const CopySegment* segments, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  LaunchKernel(CopySegmentsKernel, static_cast<unsigned>(count), kThreads, 0, stream, segments);
}

}  // namespace kvserve::kernels::cuda
