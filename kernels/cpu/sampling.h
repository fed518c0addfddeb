// The CPU twin of the sampling rule (kernels/sampling.h): the same radix selection as the CUDA
// kernel, run serially. The CPU backend's Sample and the worker's SampleToken use it.
#ifndef KVSERVE_KERNELS_CPU_SAMPLING_H_
#define KVSERVE_KERNELS_CPU_SAMPLING_H_

#include <cstdint>

#include "kernels/sampling.h"

namespace kvserve::kernels::cpu {

// The token `request` draws from `vocab` contiguous logits.
int32_t SampleRow(const float* logits, int64_t vocab, const SampleRequest& request);

// Every request of `p` (host pointers).
void Sample(const SampleParams& p);

}  // namespace kvserve::kernels::cpu

#endif  // KVSERVE_KERNELS_CPU_SAMPLING_H_
