// Sampling test cases that the CUDA conformance test (tests/gpu/cuda_backend_test.cc) and the
// CPU emulation of the sampling kernels (sampling_emulation_test.cc) share: logits rows (normal,
// or tie-heavy on a few levels), possibly in vocabulary slices, and requests mixing greedy,
// temperature, top-k, top-p and min-p.
#ifndef KVSERVE_TESTS_KERNELS_SAMPLING_CASES_H_
#define KVSERVE_TESTS_KERNELS_SAMPLING_CASES_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling.h"

namespace kvserve::kernels {

struct SamplingCase {
  int64_t rows, vocab, shard;  // shard: the slice width (== vocab: one slice)
  bool ties;                   // logits on six levels (many exact ties) instead of normal

  std::string Name() const {
    return "vocab " + std::to_string(vocab) + " slice " + std::to_string(shard);
  }
  int64_t Slices() const { return (vocab + shard - 1) / shard; }
};

// The rows laid out as SampleParams reads them: slice-major, then row, then id in the slice.
inline std::vector<float> SamplingLogits(const SamplingCase& c, std::mt19937& rng) {
  std::vector<float> logits(c.Slices() * c.rows * c.shard, 0.0f);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> level(0, 5);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < c.vocab; ++i) {
      logits[(i / c.shard) * c.rows * c.shard + r * c.shard + i % c.shard] =
          c.ties ? 0.5f * static_cast<float>(level(rng)) : normal(rng);
    }
  }
  return logits;
}

// `count` requests over the case's rows: every 8th greedy, top-k on a quarter (1 on another
// quarter), top-p on two thirds, min-p on three fifths, distinct seeds and steps.
inline std::vector<SampleRequest> SamplingRequests(const SamplingCase& c, int count,
                                                   std::mt19937& rng) {
  std::vector<SampleRequest> requests;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int k = 0; k < count; ++k) {
    SampleRequest q;
    q.row = static_cast<int32_t>(k % c.rows);
    q.temperature = k % 8 == 0 ? 0.0f : 0.05f + 2.0f * unit(rng);
    q.top_k = k % 4 == 1 ? 1 + static_cast<int32_t>(rng() % 64) : k % 4 == 2 ? 1 : 0;
    q.top_p = k % 3 == 0 ? 1.0f : 0.001f + 0.998f * unit(rng);
    q.min_p = k % 5 < 2 ? 0.0f : unit(rng);
    q.seed = rng();
    q.step = k;
    requests.push_back(q);
  }
  return requests;
}

// Logprobs of every third draw, top_n cycling through 0..20.
// Logprobs of every third draw, and of given tokens (a prompt's) on the other rows.
inline std::vector<LogprobRequest> LogprobRequestsFor(const std::vector<SampleRequest>& requests,
                                                      int64_t vocab) {
  std::vector<LogprobRequest> lq;
  for (int k = 0; k < static_cast<int>(requests.size()); ++k) {
    if (k % 3 == 0) {
      lq.push_back({requests[k].row, k, k % 21});
    } else if (k % 3 == 1) {
      lq.push_back({requests[k].row, -1, k % 7, static_cast<int32_t>((k * 7919LL) % vocab)});
    }
  }
  return lq;
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_TESTS_KERNELS_SAMPLING_CASES_H_
