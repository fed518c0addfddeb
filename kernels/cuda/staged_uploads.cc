#include "kernels/cuda/staged_uploads.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/device/cuda_check.h"

namespace kvserve::kernels::cuda {

void StagedUploads::Release() {
  for (Buffer& b : ring_) {
    if (b.done != nullptr) {
      cudaEventSynchronize(b.done);
      cudaEventDestroy(b.done);
    }
    if (b.data != nullptr) cudaFreeHost(b.data);
    b = Buffer();
  }
}

void StagedUploads::Init() {
  for (Buffer& b : ring_) {
    KVSERVE_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
  }
}

void StagedUploads::Upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (bytes > kMaxStagedBytes) {
    KVSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
    KVSERVE_CUDA_CHECK(cudaStreamSynchronize(stream));  // src may be reused at once
    return;
  }
  Buffer& b = ring_[next_];
  next_ = (next_ + 1) % ring_.size();
  KVSERVE_CUDA_CHECK(cudaEventSynchronize(b.done));  // its last copy (no wait in steady state)
  if (bytes > b.capacity) {
    if (b.data != nullptr) KVSERVE_CUDA_CHECK(cudaFreeHost(b.data));
    b.capacity = std::min(kMaxStagedBytes, std::max({bytes, 2 * b.capacity, size_t{64} << 10}));
    KVSERVE_CUDA_CHECK(cudaHostAlloc(&b.data, b.capacity, cudaHostAllocDefault));
  }
  std::memcpy(b.data, src, bytes);
  KVSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, b.data, bytes, cudaMemcpyHostToDevice, stream));
  KVSERVE_CUDA_CHECK(cudaEventRecord(b.done, stream));
}

}  // namespace kvserve::kernels::cuda
