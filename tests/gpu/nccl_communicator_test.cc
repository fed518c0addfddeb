// NCCL collectives on the GPU with one rank (NCCL refuses two ranks on one GPU); skipped
// without a CUDA device. Label: gpu.
#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

TEST(NcclCommunicatorTest, SingleRankCollectives) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ASSERT_OK_AND_ASSIGN(auto comms, CreateNcclGroup({0}, absl::Seconds(30)));
  Communicator& c = *comms[0];
  EXPECT_EQ(c.size(), 1);
  std::vector<float> host = {1, 2, 3, 4};
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 8 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_OK(c.AllReduceSum(dev, 4));
  ASSERT_OK(c.AllGather(dev, 4, dev + 4));
  ASSERT_OK(c.Broadcast(dev, 4, 0));
  ASSERT_OK(c.Barrier());
  std::vector<float> back(8);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, 8 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  cudaFree(dev);
}

}  // namespace
}  // namespace kvserve::kernels
