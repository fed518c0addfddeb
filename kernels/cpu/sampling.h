// The CPU twin of the sampling rule (kernels/sampling.h): the same radix selection as the CUDA
// kernel, run serially; and of the logprobs of drawn tokens. The CPU backend's Sample and
// Logprobs use them.
#ifndef KVSERVE_KERNELS_CPU_SAMPLING_H_
#define KVSERVE_KERNELS_CPU_SAMPLING_H_

#include <cstdint>

#include "kernels/sampling.h"

namespace kvserve::kernels::cpu {

// The token `request` draws from `vocab` contiguous logits. `kept`, when given, receives the
// set the draw was made from (tests compare it with the rule's; unset for greedy draws).
int32_t SampleRow(const float* logits, int64_t vocab, const SampleRequest& request,
                  SampleCut* kept = nullptr);

// Every request of `p` (host pointers).
void Sample(const SampleParams& p);

// The log-softmax of `vocab` contiguous logits at `token` (*logprob), its rank, and the `top_n`
// most likely ids with their values into ids[0..top_n) / values[0..top_n) (LogprobRequest's
// definitions).
void TopLogprobs(const float* logits, int64_t vocab, int32_t token, int top_n, float* logprob,
                 int32_t* rank, int32_t* ids, float* values);

// Every request of `p` (host pointers).
void Logprobs(const LogprobsParams& p);

}  // namespace kvserve::kernels::cpu

#endif  // KVSERVE_KERNELS_CPU_SAMPLING_H_
