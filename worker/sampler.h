// From a request's sampling parameters to the backend's draw (kernels/sampling.h: greedy,
// temperature, min-p, top-k, top-p, with a counter-based random stream so that a sequence's
// k-th token depends only on (seed, k): the same seed gives the same output whatever the batch,
// the preemptions or the order of requests). Logprobs are computed by the backend too.
//
//   batch.samples.push_back(MakeSampleRequest(params, seq.rng_seed, seq.num_output_tokens(), r));
//
// Pure functions; safe from any thread.
#ifndef KVSERVE_WORKER_SAMPLER_H_
#define KVSERVE_WORKER_SAMPLER_H_

#include <cstdint>

#include "kernels/sampling.h"
#include "worker/request/request.h"

namespace kvserve::worker {

// Draw `step` of the stream `seed` from logits row `row`.
kernels::SampleRequest MakeSampleRequest(const SamplingParams& params, uint64_t seed, int64_t step,
                                         int32_t row);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SAMPLER_H_
