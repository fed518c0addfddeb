// Logits-adjustment cases (kernels/logits_processing.h) that the CPU test and the CUDA kernel's
// emulation share: random rows of allowed ids, biases (bans among them) and token counts with
// penalties, over logits possibly in vocabulary slices (sampling_cases.h's layout).
#ifndef KVSERVE_TESTS_KERNELS_LOGITS_CASES_H_
#define KVSERVE_TESTS_KERNELS_LOGITS_CASES_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "kernels/logits_processing.h"

namespace kvserve::kernels {

struct LogitsCase {
  std::vector<LogitsAdjustment> rows;
  std::vector<int32_t> allowed_ids;
  std::vector<TokenBias> biases;
  std::vector<TokenCount> counts;
  std::vector<uint32_t> mask_words;

  AdjustLogitsParams Params(float* logits, int64_t num_rows, int64_t vocab, int64_t shard) const {
    AdjustLogitsParams p;
    p.logits = logits;
    p.num_rows = num_rows;
    p.vocab = vocab;
    p.shard_vocab = shard;
    p.rows = rows.data();
    p.num_adjustments = static_cast<int64_t>(rows.size());
    p.allowed_ids = allowed_ids.data();
    p.biases = biases.data();
    p.counts = counts.data();
    p.mask_words = mask_words.data();
    return p;
  }
};

// `n` distinct ids below `vocab`, ascending.
inline std::vector<int32_t> DistinctIds(int64_t vocab, int n, std::mt19937& rng) {
  std::set<int32_t> ids;
  while (static_cast<int>(ids.size()) < std::min<int64_t>(n, vocab)) {
    ids.insert(static_cast<int32_t>(rng() % vocab));
  }
  return {ids.begin(), ids.end()};
}

// Adjustments for every other row of `num_rows` (the rest stay as they are): a quarter with
// allowed ids, about three in eight with a bitmask (some with both), most with biases (an eighth of
// them bans) and token counts under random penalties, some with a penalty of exactly 1 or 0.
inline LogitsCase RandomLogitsCase(int64_t num_rows, int64_t vocab, std::mt19937& rng) {
  LogitsCase c;
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t r = 0; r < num_rows; r += 2) {
    LogitsAdjustment a;
    a.row = static_cast<int32_t>(r);
    const int k = static_cast<int>(c.rows.size());
    a.repetition_penalty = k % 3 == 0 ? 1.0f : 0.3f + 1.7f * unit(rng);
    a.frequency_penalty = k % 4 == 1 ? 0.0f : -2.0f + 4.0f * unit(rng);
    a.presence_penalty = k % 5 == 2 ? 0.0f : -2.0f + 4.0f * unit(rng);
    a.allowed_begin = static_cast<int32_t>(c.allowed_ids.size());
    if (k % 4 == 3) {
      for (int32_t id : DistinctIds(vocab, 1 + static_cast<int>(rng() % 40), rng)) {
        c.allowed_ids.push_back(id);
      }
    }
    a.allowed_end = static_cast<int32_t>(c.allowed_ids.size());
    if (k % 4 == 1 || k % 8 == 3) {  // a bitmask: each id allowed with probability 1/3
      a.mask_begin = static_cast<int32_t>(c.mask_words.size());
      for (int64_t w = 0; w < (vocab + 31) / 32; ++w) {
        c.mask_words.push_back(static_cast<uint32_t>(rng() & rng() & rng()) |
                               static_cast<uint32_t>(rng() & rng()));
      }
    }
    a.bias_begin = static_cast<int32_t>(c.biases.size());
    for (int32_t id : DistinctIds(vocab, static_cast<int>(rng() % 300), rng)) {
      const float bias =
          rng() % 8 == 0 ? -std::numeric_limits<float>::infinity() : -100.0f + 200.0f * unit(rng);
      c.biases.push_back({id, bias});
    }
    a.bias_end = static_cast<int32_t>(c.biases.size());
    a.counts_begin = static_cast<int32_t>(c.counts.size());
    for (int32_t id : DistinctIds(vocab, static_cast<int>(rng() % 1000), rng)) {
      const auto output = static_cast<int32_t>(rng() % 4);
      c.counts.push_back({id, output, output == 0 ? 1 : static_cast<int32_t>(rng() % 2)});
    }
    a.counts_end = static_cast<int32_t>(c.counts.size());
    c.rows.push_back(a);
  }
  return c;
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_TESTS_KERNELS_LOGITS_CASES_H_
