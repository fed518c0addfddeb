// Token sampling from one row of logits: greedy, temperature, min-p, top-k, top-p (applied in
// that order, as vLLM does), with a counter-based random stream so that a sequence's k-th token
// depends only on (seed, k): the same seed gives the same output whatever the batch, the
// preemptions or the order of requests.
//
//   int32_t token = SampleToken(logits_row, params, seq.rng_seed, seq.num_output_tokens());
//   TokenLogprobs lp = ComputeLogprobs(logits_row, token, /*top_n=*/5);
//
// Pure functions; safe from any thread.
#ifndef KVSERVE_WORKER_SAMPLER_H_
#define KVSERVE_WORKER_SAMPLER_H_

#include <cstdint>

#include "absl/types/span.h"
#include "worker/request.h"

namespace kvserve::worker {

// A uniform double in [0, 1) for draw `step` of the stream `seed`.
double UniformDraw(uint64_t seed, int64_t step);

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params, uint64_t seed,
                    int64_t step);

// Log-softmax of the raw logits (before temperature and filters, as vLLM reports them) for
// `token` and the `top_n` most likely tokens.
TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int top_n);

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_SAMPLER_H_
