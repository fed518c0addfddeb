// Launcher of GPU sampling: one thread block per request applies kernels/sampling.h's rule by
// radix selection over the row (no sort of the vocabulary), drawing the same token as the CPU
// twin (kernels/cpu/sampling.h). Pointers in `p` are device pointers; asynchronous on `stream`.
#ifndef KVSERVE_KERNELS_CUDA_OPS_SAMPLING_H_
#define KVSERVE_KERNELS_CUDA_OPS_SAMPLING_H_

#include <cuda_runtime_api.h>

#include "kernels/sampling.h"

namespace kvserve::kernels::cuda {

void LaunchSample(const SampleParams& p, cudaStream_t stream);

// Logprobs of drawn tokens, one thread block per request (the CPU twin: cpu::Logprobs).
void LaunchLogprobs(const LogprobsParams& p, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_SAMPLING_H_
