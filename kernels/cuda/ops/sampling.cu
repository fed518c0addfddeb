// Launchers of GPU sampling and logprobs (the kernels: sampling.cuh).
#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/ops/sampling.cuh"
#include "kernels/cuda/ops/sampling.h"

namespace kvserve::kernels::cuda {

using sampling::kThreads;
using sampling::LogprobsKernel;
using sampling::SampleKernel;

void LaunchLogprobs(const LogprobsParams& p, cudaStream_t stream) {
  if (p.num_requests == 0) return;
  LaunchKernel(LogprobsKernel, static_cast<unsigned>(p.num_requests), kThreads, 0, stream, p);
}

void LaunchSample(const SampleParams& p, cudaStream_t stream) {
  if (p.num_requests == 0) return;
  LaunchKernel(SampleKernel, static_cast<unsigned>(p.num_requests), kThreads, 0, stream, p);
}

}  // namespace kvserve::kernels::cuda
