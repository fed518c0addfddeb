#include "kernels/cpu/logits_processing.h"

#include <algorithm>
#include <limits>

namespace kvserve::kernels::cpu {

void AdjustLogits(const AdjustLogitsParams& p) {
  for (int64_t k = 0; k < p.num_adjustments; ++k) {
    const LogitsAdjustment& a = p.rows[k];
    auto at = [&](int64_t id) -> float& {
      return p.logits[LogitIndex(p.num_rows, p.vocab, p.shard_vocab, a.row, id)];
    };
    if (a.allowed_end > a.allowed_begin) {
      const int32_t* allowed = p.allowed_ids + a.allowed_begin;
      const int32_t n = a.allowed_end - a.allowed_begin;
      for (int64_t id = 0; id < p.vocab; ++id) {
        if (!SortedContains(allowed, n, static_cast<int32_t>(id))) {
          at(id) = -std::numeric_limits<float>::infinity();
        }
      }
    }
    if (a.mask_begin >= 0) {  // a word at a time: a word that allows all 32 ids is skipped
      for (int64_t base = 0; base < p.vocab; base += 32) {
        const uint32_t word = p.mask_words[a.mask_begin + (base >> 5)];
        if (word == ~0u) continue;
        for (int64_t id = base; id < std::min<int64_t>(base + 32, p.vocab); ++id) {
          if (!MaskAllows(p, a, id)) at(id) = -std::numeric_limits<float>::infinity();
        }
      }
    }
    for (int32_t i = a.bias_begin; i < a.bias_end; ++i) {
      float& logit = at(p.biases[i].id);
      logit = Biased(logit, p.biases[i].bias);
    }
    for (int32_t i = a.counts_begin; i < a.counts_end; ++i) {
      const TokenCount& c = p.counts[i];
      float& logit = at(c.id);
      logit = Penalized(logit, c, a.repetition_penalty, a.frequency_penalty, a.presence_penalty);
    }
  }
}

}  // namespace kvserve::kernels::cpu
