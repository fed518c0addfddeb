// The adjustments a request's sampling parameters make to its logits row before the draw
// (vLLM's order and definitions), applied in place by every backend with the same arithmetic
// (the CPU twin in kernels/cpu/logits_processing.cc, the CUDA kernel in
// kernels/cuda/ops/logits_processing.cuh), so that both draw the same token bit for bit:
//  1. allowed ids: when the row has a list, every other id gets -inf; likewise when it has a
//     bitmask (structured outputs' allowed tokens), every id whose bit is clear;
//  2. biases, in order of the list: logit + bias (banned ids come as a -inf bias: bad words,
//     and the stop ids while min_tokens is not reached);
//  3. penalties, per distinct token of the sequence: the repetition penalty r (CTRL / Hugging
//     Face: logit / r when positive, logit · r otherwise) for tokens of the prompt or the
//     output, then logit - frequency · count - presence for tokens of the output (OpenAI).
// Each list names an id once, so a row's entries touch distinct logits and may run in any
// order within a step.
//
// Plain C++17 (also compiled by nvcc).
#ifndef KVSERVE_KERNELS_LOGITS_PROCESSING_H_
#define KVSERVE_KERNELS_LOGITS_PROCESSING_H_

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/rounded.h"

namespace kvserve::kernels {

// A token of a sequence: how often its output holds it, and whether its prompt does.
struct TokenCount {
  int32_t id = 0;
  int32_t output_count = 0;
  int32_t in_prompt = 0;  // 0 or 1
};

struct TokenBias {
  int32_t id = 0;
  float bias = 0.0f;  // -inf bans the id
};

// One logits row's adjustments; each [begin, end) indexes the params' lists.
struct LogitsAdjustment {
  int32_t row = 0;
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t allowed_begin = 0, allowed_end = 0;  // ascending ids; empty: every id allowed
  // The row's bitmask: (vocab + 31) / 32 words of mask_words from here, id allowed when bit
  // id % 32 of word id / 32 is set; -1: none.
  int32_t mask_begin = -1;
  int32_t bias_begin = 0, bias_end = 0;
  int32_t counts_begin = 0, counts_end = 0;
};

// Rows of logits laid out as SampleParams says (vocabulary slices of shard_vocab ids), changed
// in place. Pointers are backend memory.
struct AdjustLogitsParams {
  float* logits = nullptr;
  int64_t num_rows = 0, vocab = 0, shard_vocab = 0;
  const LogitsAdjustment* rows = nullptr;
  int64_t num_adjustments = 0;
  const int32_t* allowed_ids = nullptr;
  const TokenBias* biases = nullptr;
  const TokenCount* counts = nullptr;
  const uint32_t* mask_words = nullptr;
};

// Whether row `a`'s bitmask (if any) allows `id`.
KVSERVE_HD inline bool MaskAllows(const AdjustLogitsParams& p, const LogitsAdjustment& a,
                                  int64_t id) {
  return a.mask_begin < 0 || ((p.mask_words[a.mask_begin + (id >> 5)] >> (id & 31)) & 1u) != 0;
}

// Where id `id` of row `row` is (SampleParams' layout).
KVSERVE_HD inline int64_t LogitIndex(int64_t num_rows, int64_t vocab, int64_t shard_vocab,
                                     int64_t row, int64_t id) {
  const int64_t shard = shard_vocab > 0 && shard_vocab < vocab ? shard_vocab : vocab;
  const int64_t s = id / shard;
  return s * num_rows * shard + row * shard + (id - s * shard);
}

KVSERVE_HD inline float Biased(float logit, float bias) { return rounded::Add(logit, bias); }

// A token's logit after the penalties (step 3), as separately rounded operations.
KVSERVE_HD inline float Penalized(float logit, const TokenCount& c, float repetition,
                                  float frequency, float presence) {
  using rounded::Div;
  using rounded::Mul;
  using rounded::Sub;
  if (repetition != 1.0f && (c.in_prompt != 0 || c.output_count > 0)) {
    logit = logit > 0.0f ? Div(logit, repetition) : Mul(logit, repetition);
  }
  if (c.output_count > 0) {
    logit = Sub(logit, Mul(frequency, static_cast<float>(c.output_count)));
    logit = Sub(logit, presence);
  }
  return logit;
}

// Whether `id` is in the ascending list [ids, ids + n).
KVSERVE_HD inline bool SortedContains(const int32_t* ids, int32_t n, int32_t id) {
  int32_t lo = 0, hi = n;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (ids[mid] < id) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && ids[lo] == id;
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_LOGITS_PROCESSING_H_
