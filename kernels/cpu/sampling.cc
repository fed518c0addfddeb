#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kvserve::kernels::cpu {
namespace {

// The lowest id holding the largest logit (NaNs ignored; 0 when every logit is NaN).
int64_t Argmax(const float* logits, int64_t vocab, float* max_logit) {
  int64_t best = -1;
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (!std::isnan(l) && (best < 0 || l > max)) {
      best = i;
      max = l;
    }
  }
  *max_logit = max;
  return best < 0 ? 0 : best;
}

// Tokens and their weights in id order: the whole vocabulary (ids null: position = id) or the
// tokens a cut kept. Every cut keeps a prefix of the order (weight descending, id ascending), so
// a later selection, whose answer lies inside that prefix, may look at the kept tokens only and
// find what a scan of the whole vocabulary (the GPU's way) finds, in less time.
struct Tokens {
  const uint64_t* w;
  const int32_t* ids;
  size_t n;
  int64_t id(size_t i) const { return ids == nullptr ? static_cast<int64_t>(i) : ids[i]; }
};

SampleCut Select(const Tokens& tokens, RadixSelect sel) {
  uint32_t counts[kRadixBuckets];
  uint64_t sums[kRadixBuckets];
  while (!sel.done()) {
    std::fill(std::begin(counts), std::end(counts), 0u);
    std::fill(std::begin(sums), std::end(sums), uint64_t{0});
    for (size_t i = 0; i < tokens.n; ++i) {
      const uint64_t x = tokens.w[i];
      if (!sel.Matches(x)) continue;
      const int d = sel.Digit(x);
      ++counts[d];
      sums[d] += x;
    }
    sel.Choose(counts, sums);
  }
  SampleCut cut;
  cut.value = sel.value();
  cut.mass = sel.mass();
  cut.last_tie = std::numeric_limits<int64_t>::max();  // every tie
  if (sel.ties() < sel.tie_count()) {
    uint64_t seen = 0;
    for (size_t i = 0; i < tokens.n; ++i) {
      if (tokens.w[i] == cut.value && ++seen == sel.ties()) {
        cut.last_tie = tokens.id(i);
        break;
      }
    }
  }
  return cut;
}

}  // namespace

int32_t SampleRow(const float* logits, int64_t vocab, const SampleRequest& r) {
  float max_logit = 0.0f;
  const auto best = static_cast<int32_t>(Argmax(logits, vocab, &max_logit));
  if (!(r.temperature >= kGreedyTemperature)) return best;
  const float inv_t = InverseTemperature(r.temperature);
  const uint64_t min_w = MinPWeight(r.min_p);
  std::vector<uint64_t> w(vocab);
  uint64_t num_min_p = 0, mass_min_p = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = TokenWeight(logits[i], max_logit, inv_t);
    if (w[i] >= min_w) {
      ++num_min_p;
      mass_min_p += w[i];
    }
  }
  SampleCut cut;  // min-p alone: w >= min_w (everything when min_w is 0)
  cut.value = min_w == 0 ? 0 : min_w - 1;
  cut.last_tie = min_w == 0 ? vocab - 1 : -1;
  cut.mass = mass_min_p;
  Tokens all{w.data(), nullptr, w.size()};
  bool narrowed = min_w > 0;
  if (r.top_k > 0 && static_cast<uint64_t>(r.top_k) < num_min_p) {
    cut = Select(all, {RadixSelect::kCount, static_cast<uint64_t>(r.top_k)});
    narrowed = true;
  }
  // Once min-p or top-k has narrowed the field, top-p and the draw look at the kept tokens only.
  std::vector<int32_t> kept_ids;
  std::vector<uint64_t> kept_w;
  Tokens kept = all;
  if (narrowed && cut.mass > 0) {
    for (int64_t i = 0; i < vocab; ++i) {
      if (!cut.Keeps(w[i], i)) continue;
      kept_ids.push_back(static_cast<int32_t>(i));
      kept_w.push_back(w[i]);
    }
    kept = {kept_w.data(), kept_ids.data(), kept_w.size()};
  }
  if (r.top_p < 1.0f && cut.mass > 0) {
    cut = Select(kept, {RadixSelect::kMass, TopPTarget(r.top_p, cut.mass)});
  }
  if (cut.mass == 0) return best;
  const uint64_t target = DrawTarget(DrawBits(r.seed, r.step), cut.mass);
  uint64_t sum = 0;
  for (size_t i = 0; i < kept.n; ++i) {
    if (!cut.Keeps(kept.w[i], kept.id(i))) continue;
    sum += kept.w[i];
    if (sum > target) return static_cast<int32_t>(kept.id(i));
  }
  return best;  // not reached: target < mass
}

void Sample(const SampleParams& p) {
  const int64_t shard = p.shard_vocab > 0 ? p.shard_vocab : p.vocab;
  std::vector<float> row;
  for (int64_t k = 0; k < p.num_requests; ++k) {
    const SampleRequest& r = p.requests[k];
    const float* logits = p.logits + r.row * shard;
    if (shard < p.vocab) {  // gather the row's slices
      row.resize(p.vocab);
      for (int64_t v0 = 0; v0 < p.vocab; v0 += shard) {
        const float* slice = p.logits + (v0 / shard) * p.num_rows * shard + r.row * shard;
        std::copy_n(slice, std::min(shard, p.vocab - v0), row.data() + v0);
      }
      logits = row.data();
    }
    p.tokens[k] = SampleRow(logits, p.vocab, r);
  }
}

}  // namespace kvserve::kernels::cpu
