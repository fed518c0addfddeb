// Device buffers for the CUDA backend's tests: a device copy of a host vector, or NaN-poisoned
// memory, read back with Host(). Failures are gtest expectations.
#ifndef KVSERVE_TESTS_GPU_DEV_BUFFER_H_
#define KVSERVE_TESTS_GPU_DEV_BUFFER_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve::kernels {

// A device copy of a host vector; NaN-poisoned when made from a size alone.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    // The backend's streams do not wait for the legacy stream: finish the copy here.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  explicit Dev(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&ptr_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0xff, Bytes()), cudaSuccess);  // NaN for floats
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~Dev() { cudaFree(ptr_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;

  T* get() const { return ptr_; }
  std::vector<T> Host() const {
    std::vector<T> out(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t Bytes() const { return std::max<size_t>(1, n_ * sizeof(T)); }
  T* ptr_ = nullptr;
  size_t n_;
};

}  // namespace kvserve::kernels

#endif  // KVSERVE_TESTS_GPU_DEV_BUFFER_H_
