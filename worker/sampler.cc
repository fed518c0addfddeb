#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kvserve::worker {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int32_t Argmax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

double UniformDraw(uint64_t seed, int64_t step) {
  uint64_t bits = SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t SampleToken(absl::Span<const float> logits, const SamplingParams& params, uint64_t seed,
                    int64_t step) {
  if (params.temperature < 1e-5f) return Argmax(logits);
  const int vocab = static_cast<int>(logits.size());
  const double inv_t = 1.0 / params.temperature;
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(vocab);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) {
    probs[i] = std::exp((static_cast<double>(logits[i]) - max_logit) * inv_t);
    total += probs[i];
  }
  // Candidates, most likely first (ties by id), after the filters.
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  int keep = vocab;
  if (params.min_p > 0.0f) {
    const double floor = params.min_p * (1.0 / total);  // the top token's probability is 1/total
    keep = static_cast<int>(std::partition(order.begin(), order.end(),
                                           [&](int32_t i) { return probs[i] / total >= floor; }) -
                            order.begin());
  }
  const bool need_sort = params.top_k > 0 || params.top_p < 1.0f;
  if (need_sort) {
    auto by_prob = [&](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    };
    if (params.top_k > 0 && params.top_k < keep) {
      std::partial_sort(order.begin(), order.begin() + params.top_k, order.begin() + keep, by_prob);
      keep = params.top_k;
    } else {
      std::sort(order.begin(), order.begin() + keep, by_prob);
    }
    if (params.top_p < 1.0f) {
      double kept = 0.0;
      for (int i = 0; i < keep; ++i) kept += probs[order[i]];
      double cumulative = 0.0;
      int n = 0;
      while (n < keep && (n == 0 || cumulative < params.top_p * kept))
        cumulative += probs[order[n++]];
      keep = n;
    }
  }
  double mass = 0.0;
  for (int i = 0; i < keep; ++i) mass += probs[order[i]];
  const double target = UniformDraw(seed, step) * mass;
  double acc = 0.0;
  for (int i = 0; i < keep; ++i) {
    acc += probs[order[i]];
    if (target < acc) return order[i];
  }
  return order[keep - 1];
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
