#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kvserve::worker {
kernels::SampleRequest MakeSampleRequest(const SamplingParams& params, uint64_t seed, int64_t step,
                                         int32_t row) {
  kernels::SampleRequest r;
  r.row = row;
  r.temperature = params.temperature;
  r.top_k = params.top_k;
  r.top_p = params.top_p;
  r.min_p = params.min_p;
  r.seed = seed;
  r.step = step;
  return r;
}

TokenLogprobs ComputeLogprobs(absl::Span<const float> logits, int32_t token, int top_n) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  const double log_z = max_logit + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(logits[token] - log_z);
  if (top_n > 0) {
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    const int n = std::min<int>(top_n, static_cast<int>(logits.size()));
    std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int i = 0; i < n; ++i) {
      out.top.emplace_back(order[i], static_cast<float>(logits[order[i]] - log_z));
    }
  }
  return out;
}

}  // namespace kvserve::worker
