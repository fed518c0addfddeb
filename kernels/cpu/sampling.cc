#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
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
  // Over gathered tokens "every tie" means every tie gathered: name the last one, so that the
  // cut also holds over the whole vocabulary.
  if (sel.ties() < sel.tie_count() || tokens.ids != nullptr) {
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

int32_t SampleRow(const float* logits, int64_t vocab, const SampleRequest& r, SampleCut* kept_set) {
  float max_logit = 0.0f;
  const auto best = static_cast<int32_t>(Argmax(logits, vocab, &max_logit));
  if (!(r.temperature >= kGreedyTemperature)) return best;
  const float inv_t = InverseTemperature(r.temperature);
  const uint64_t min_w = MinPWeight(r.min_p), floor = CandidateFloor(min_w);
  std::vector<uint64_t> w(vocab);
  uint64_t num_min_p = 0, mass_min_p = 0, num_candidates = 0, mass_candidates = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = TokenWeight(logits[i], max_logit, inv_t);
    if (w[i] >= min_w) {
      ++num_min_p;
      mass_min_p += w[i];
    }
  }
  // Only a selection (or a min-p above the floor) can confine the draw to the candidates.
  const bool may_confine = r.top_k > 0 || r.top_p < 1.0f || min_w == floor;
  for (int64_t i = 0; may_confine && i < vocab; ++i) {
    if (w[i] >= floor) {
      ++num_candidates;
      mass_candidates += w[i];
    }
  }
  SampleCut cut;  // min-p alone: w >= min_w (everything when min_w is 0)
  cut.value = min_w == 0 ? 0 : min_w - 1;
  cut.last_tie = min_w == 0 ? vocab - 1 : -1;
  cut.mass = mass_min_p;
  // The tokens the selections and the draw look at: all, or (gathered) the ones a cut keeps.
  std::vector<int32_t> kept_ids;
  std::vector<uint64_t> kept_w;
  Tokens kept{w.data(), nullptr, w.size()};
  auto gather = [&](const SampleCut& c) {
    for (int64_t i = 0; i < vocab; ++i) {
      if (!c.Keeps(w[i], i)) continue;
      kept_ids.push_back(static_cast<int32_t>(i));
      kept_w.push_back(w[i]);
    }
    kept = {kept_w.data(), kept_ids.data(), kept_w.size()};
  };
  // As the GPU does: the candidates when they hold the answer.
  if (may_confine &&
      CandidatesSuffice(r, min_w, num_candidates, mass_candidates, num_min_p, mass_min_p)) {
    SampleCut candidates;  // w >= floor
    candidates.value = floor - 1;
    candidates.last_tie = -1;
    gather(candidates);
  }
  bool narrowed = min_w > 0;
  if (r.top_k > 0 && static_cast<uint64_t>(r.top_k) < num_min_p) {
    cut = Select(kept, {RadixSelect::kCount, static_cast<uint64_t>(r.top_k)});
    narrowed = true;
  }
  // Once min-p or top-k has narrowed the field, top-p and the draw look at the kept tokens only.
  if (kept.ids == nullptr && narrowed && cut.mass > 0) gather(cut);
  if (r.top_p < 1.0f && cut.mass > 0) {
    cut = Select(kept, {RadixSelect::kMass, TopPTarget(r.top_p, cut.mass)});
  }
  if (kept_set != nullptr) *kept_set = cut;
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

namespace {

// Row `r` of logits laid out as SampleParams describes, contiguous: in place, or gathered from
// its vocabulary slices into `scratch`.
const float* RowOf(const float* logits, int64_t num_rows, int64_t vocab, int64_t shard_vocab,
                   int64_t r, std::vector<float>& scratch) {
  const int64_t shard = shard_vocab > 0 ? shard_vocab : vocab;
  if (shard >= vocab) return logits + r * vocab;
  scratch.resize(vocab);
  for (int64_t v0 = 0; v0 < vocab; v0 += shard) {
    const float* slice = logits + (v0 / shard) * num_rows * shard + r * shard;
    std::copy_n(slice, std::min(shard, vocab - v0), scratch.data() + v0);
  }
  return scratch.data();
}

}  // namespace

void Sample(const SampleParams& p) {
  std::vector<float> row;
  for (int64_t k = 0; k < p.num_requests; ++k) {
    const SampleRequest& r = p.requests[k];
    p.tokens[k] =
        SampleRow(RowOf(p.logits, p.num_rows, p.vocab, p.shard_vocab, r.row, row), p.vocab, r);
  }
}

void TopLogprobs(const float* logits, int64_t vocab, int32_t token, int top_n, float* logprob,
                 int32_t* rank, int32_t* ids, float* values) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) max = std::max(max, static_cast<double>(logits[i]));
  }
  double sum = 0.0;
  int32_t at_least = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    sum += std::exp(static_cast<double>(logits[i]) - max);
    at_least += logits[i] >= logits[token] ? 1 : 0;
  }
  const double log_z = max + std::log(sum);
  *logprob = static_cast<float>(logits[token] - log_z);
  *rank = at_least;
  const int n = static_cast<int>(std::min<int64_t>(top_n, vocab));
  if (n <= 0) return;
  // One 64-bit key per id, larger first: OrderedKey(logit) above the id's complement (the lower id
  // first among equal logits); the n largest, sorted (integer keys: 2.3x faster than comparing
  // logits through OrderedKey at a 128K vocabulary).
  std::vector<uint64_t> order(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    order[i] = uint64_t{OrderedKey(logits[i])} << 32 | (0xffffffffu - static_cast<uint32_t>(i));
  }
  if (n < vocab) {
    std::partial_sort(order.begin(), order.begin() + n, order.end(), std::greater<>());
  } else {  // the whole vocabulary: a sort is twice a heap's speed
    std::sort(order.begin(), order.end(), std::greater<>());
  }
  for (int i = 0; i < n; ++i) {
    ids[i] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(order[i]));
    values[i] = static_cast<float>(logits[ids[i]] - log_z);
  }
}

void Logprobs(const LogprobsParams& p) {
  std::vector<float> row;
  for (int64_t k = 0; k < p.num_requests; ++k) {
    const LogprobRequest& q = p.requests[k];
    TopLogprobs(RowOf(p.logits, p.num_rows, p.vocab, p.shard_vocab, q.row, row), p.vocab,
                q.sample >= 0 ? p.tokens[q.sample] : q.token, std::min(q.top_n, kMaxTopLogprobs),
                p.logprob + k, p.rank + k, p.top_ids + k * kMaxTopLogprobs,
                p.top_logprobs + k * kMaxTopLogprobs);
  }
}

}  // namespace kvserve::kernels::cpu
