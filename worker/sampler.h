// From a request's sampling parameters to the backend's draw (kernels/sampling.h: greedy,
// temperature, min-p, top-k, top-p, with a counter-based random stream so that a sequence's
// k-th token depends only on (seed, k): the same seed gives the same output whatever the batch,
// the preemptions or the order of requests), and logprobs from a row of logits.
//
//   batch.samples.push_back(MakeSampleRequest(params, seq.rng_seed, seq.num_output_tokens(), r));
//   TokenLogprobs lp = ComputeLogprobs(logits_row, token, /*top_n=*/5);
//
// Pure functions; safe from any thread.
#ifndef KVSERVE_WORKER_SAMPLER_H_
#define KVSERVE_WORKER_SAMPLER_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/sampling.h"
#include "worker/request.h"

namespace kvserve::worker {

// Draw `step` of the stream `seed` from logits row `row`.
kernels::SampleRequest MakeSampleRequest(const SamplingParams& params, uint64_t seed, int64_t step,
                                         int32_t row);

// Log-softmax of the raw logits (before temperature and filters, as vLLM reports them) for
// `token` and the `top_n` most likely tokens.
TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int top_n);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SAMPLER_H_
