// The CUDA backend's scratch buffers: one device buffer per use that only grows, and what it
// holds by the backend's own count (Backend::ScratchBytes).
//
//   DeviceScratch s;
//   void* p = s.Get(bytes, stream, &grew, graphs_exist ? &kept : nullptr);
//
// Used by the backend's owning thread only.
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_DEVICE_SCRATCH_H_
#define KVSERVE_KERNELS_CUDA_DEVICE_DEVICE_SCRATCH_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda/device/cuda_check.h"

namespace kvserve::kernels::cuda {

// A device buffer that only grows (stream-ordered allocation, so growing never syncs). A graph
// recorded with the old buffer reads it still: the backend keeps it (`keep`) while graphs
// exist, and refuses growth while recording (`grew`).
class DeviceScratch {
 public:
  // `zeroed`: each new buffer is zeroed (in stream order) for users that leave it zeroed.
  explicit DeviceScratch(bool zeroed = false) : zeroed_(zeroed) {}

  // Grows the buffer to at least `bytes`; the old one is freed, or handed to `keep` (when not
  // null) for what still reads it.
  void* Get(size_t bytes, cudaStream_t stream, bool* grew,
            std::vector<std::pair<void*, size_t>>* keep) {
    if (bytes > bytes_) {
      *grew = true;
      if (data_ != nullptr && keep != nullptr) {
        keep->emplace_back(data_, bytes_);
      } else if (data_ != nullptr) {
        KVSERVE_CUDA_CHECK(cudaFreeAsync(data_, stream));
      }
      bytes_ = std::max(bytes, bytes_ * 2);
      KVSERVE_CUDA_CHECK(cudaMallocAsync(&data_, bytes_, stream));
      if (zeroed_) KVSERVE_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes_, stream));
    }
    return data_;
  }
  void Release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  [[nodiscard]] size_t bytes() const { return bytes_; }

 private:
  const bool zeroed_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_DEVICE_SCRATCH_H_
