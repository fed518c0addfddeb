#include "worker/logits_processor.h"

#include <algorithm>
#include <limits>

#include "common/structured/token_mask.h"
#include "worker/constraints.h"

namespace kvserve::worker {
namespace {

constexpr float kBan = -std::numeric_limits<float>::infinity();

// Counts seq.tokens from counts.counted on: prompt tokens mark in_prompt (kept only for the
// repetition penalty), generated ones add to output_count.
void UpdateCounts(Sequence& seq, bool with_prompt) {
  TokenCounts& c = seq.counts;
  for (; c.counted < seq.num_tokens(); ++c.counted) {
    const bool prompt = c.counted < seq.num_prompt_tokens;
    if (prompt && !with_prompt) continue;
    const int32_t id = seq.tokens[c.counted];
    auto [it, added] = c.index.try_emplace(id, static_cast<int32_t>(c.entries.size()));
    if (added) c.entries.push_back({id, 0, 0});
    kernels::TokenCount& e = c.entries[it->second];
    if (prompt) {
      e.in_prompt = 1;
    } else {
      ++e.output_count;
    }
  }
}

// The row's biases: logit_bias, then bans overriding it; distinct ids.
void AddBiases(const SamplingParams& s, absl::Span<const int32_t> bans, ForwardBatch& batch) {
  std::vector<kernels::TokenBias>& out = batch.biases;
  const size_t begin = out.size();
  for (const auto& [id, bias] : s.logit_bias) out.push_back({id, bias});
  if (bans.empty()) return;
  for (int32_t id : bans) out.push_back({id, kBan});
  // Sorted by id with bans after the biases of the same id, then the last of each id kept.
  std::stable_sort(out.begin() + begin, out.end(),
                   [](const auto& a, const auto& b) { return a.id < b.id; });
  size_t kept = begin;
  for (size_t i = begin; i < out.size(); ++i) {
    if (kept > begin && out[kept - 1].id == out[i].id) {
      out[kept - 1] = out[i];
    } else {
      out[kept++] = out[i];
    }
  }
  out.resize(kept);
}

}  // namespace

std::vector<int32_t> BannedByBadWords(const std::vector<std::vector<int32_t>>& bad_words,
                                      absl::Span<const int32_t> output) {
  std::vector<int32_t> banned;
  for (const std::vector<int32_t>& word : bad_words) {
    const size_t prefix = word.size() - 1;
    if (word.empty() || prefix > output.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, output.end() - prefix)) {
      banned.push_back(word.back());
    }
  }
  std::sort(banned.begin(), banned.end());
  banned.erase(std::unique(banned.begin(), banned.end()), banned.end());
  return banned;
}

void AddLogitsAdjustment(Sequence& seq, int32_t logit_row, absl::Span<const int32_t> eos_ids,
                         ForwardBatch& batch) {
  const RequestInput& in = seq.request->input;
  const SamplingParams& s = in.sampling;
  if (!s.adjusts_logits() && seq.allowed_mask == nullptr && !seq.mask_pending) return;
  kernels::LogitsAdjustment a;
  a.row = logit_row;
  a.allowed_begin = static_cast<int32_t>(batch.allowed_ids.size());
  batch.allowed_ids.insert(batch.allowed_ids.end(), s.allowed_token_ids.begin(),
                           s.allowed_token_ids.end());
  a.allowed_end = static_cast<int32_t>(batch.allowed_ids.size());
  if (seq.allowed_mask != nullptr) {
    a.mask_begin = static_cast<int32_t>(batch.mask_words.size());
    batch.mask_words.insert(batch.mask_words.end(), seq.allowed_mask->words.begin(),
                            seq.allowed_mask->words.end());
  } else if (seq.mask_pending) {  // its words come from batch.fill_masks
    a.mask_begin = static_cast<int32_t>(batch.mask_words.size());
    batch.mask_words.resize(batch.mask_words.size() + seq.request->constraint->mask_words, 0u);
  }

  const absl::Span<const int32_t> output(seq.tokens.data() + seq.num_prompt_tokens,
                                         seq.num_output_tokens());
  std::vector<int32_t> bans = BannedByBadWords(s.bad_words, output);
  if (seq.num_output_tokens() < s.min_tokens) {
    bans.insert(bans.end(), in.stop_token_ids.begin(), in.stop_token_ids.end());
    if (!s.ignore_eos) bans.insert(bans.end(), eos_ids.begin(), eos_ids.end());
  }
  a.bias_begin = static_cast<int32_t>(batch.biases.size());
  AddBiases(s, bans, batch);
  a.bias_end = static_cast<int32_t>(batch.biases.size());

  a.counts_begin = static_cast<int32_t>(batch.token_counts.size());
  if (s.penalized()) {
    a.repetition_penalty = s.repetition_penalty;
    a.frequency_penalty = s.frequency_penalty;
    a.presence_penalty = s.presence_penalty;
    UpdateCounts(seq, /*with_prompt=*/s.repetition_penalty != 1.0f);
    batch.token_counts.insert(batch.token_counts.end(), seq.counts.entries.begin(),
                              seq.counts.entries.end());
  }
  a.counts_end = static_cast<int32_t>(batch.token_counts.size());
  const bool empty = a.allowed_end == a.allowed_begin && a.bias_end == a.bias_begin &&
                     a.counts_end == a.counts_begin && a.mask_begin < 0;
  if (!empty) batch.adjustments.push_back(a);  // (min_tokens alone, once reached: nothing)
}

}  // namespace kvserve::worker
