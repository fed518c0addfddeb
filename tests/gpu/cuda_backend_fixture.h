// The CUDA backend tests' fixture (cuda_backend_test, its files): a CUDA backend and the CPU
// reference backend, skipped without a CUDA device. In a named namespace: GoogleTest wants one
// fixture class per test suite across the binary's files.
#ifndef KVSERVE_TESTS_GPU_CUDA_BACKEND_FIXTURE_H_
#define KVSERVE_TESTS_GPU_CUDA_BACKEND_FIXTURE_H_

#include <cuda_runtime.h>

#include <memory>
#include <random>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess)

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_OK_AND_ASSIGN(gpu_, CreateCudaBackend({}));
    cpu_ = CreateCpuBackend({});
  }
  void Sync() { gpu_->Synchronize(); }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::mt19937 rng_{7};
};

}  // namespace kvserve::kernels

#endif  // KVSERVE_TESTS_GPU_CUDA_BACKEND_FIXTURE_H_
