// Launcher of batched block copies: every (source, destination, bytes) segment of one step in
// one kernel launch. Pointers may be device memory or mapped pinned host memory (the swap
// pool), which the GPU reads and writes directly over PCIe, so swap-out, copy-on-write and
// swap-in all go through the same kernel.
#ifndef KVSERVE_KERNELS_CUDA_OPS_COPY_BLOCKS_H_
#define KVSERVE_KERNELS_CUDA_OPS_COPY_BLOCKS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvserve::kernels::cuda {

struct CopySegment {
  const uint8_t* src;
  uint8_t* dst;
  int64_t bytes;
};

// `segments` is a device (or mapped host) array of `count` entries.
void LaunchCopySegments(const CopySegment* segments, int64_t count, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_COPY_BLOCKS_H_
