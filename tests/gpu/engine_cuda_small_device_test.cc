// Weights that do not fit on the GPU are refused at start-up with an error that says how much
// they need, how much is free and what to change, where a failed cudaMalloc halfway through
// loading would abort the process. A fixture is far too small to fill a real GPU, so this runs
// on the emulated device (KVSERVE_CUDA=EMULATED) made small with KVSERVE_EMULATED_GPU_MIB, and
// skips on larger devices. Label: gpu.
#include <cuda_runtime_api.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

TEST(EngineCudaSmallDeviceTest, WeightsThatDoNotFitAreRefusedSayingWhatToChange) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  // tiny-llama3 holds 3 MiB of float32 weights: a device with 2 MiB free cannot take them.
  if (free > size_t{2} << 20) GTEST_SKIP() << "the device has more than 2 MiB free";
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.backend.device = Device::kCuda;
  config.dtype = WeightDtype::kFloat32;
  EXPECT_THAT(
      Engine::Create(config).status(),
      kvserve::testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                 ::testing::AllOf(::testing::HasSubstr("the weights need"),
                                                  ::testing::HasSubstr("--dtype bfloat16"))));
}

}  // namespace
}  // namespace kvserve::worker
