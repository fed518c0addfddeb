// The sampling rule, defined so that a GPU can apply it without sorting the vocabulary and
// every backend draws the same token bit for bit (the CPU twin in kernels/cpu/sampling.cc, the
// CUDA kernel in kernels/cuda/ops/sampling.cu; both share the arithmetic below).
//
// For one logits row and a SampleRequest:
//  1. temperature < kGreedyTemperature: the argmax (lowest id among equal maxima).
//  2. Each token gets an integer weight w = TokenWeight(logit, max_logit, 1 / temperature),
//     about 2^40 · exp((logit - max) / T) (the top token weighs exactly 2^40).
//  3. Tokens are ordered by (w descending, id ascending). The kept set is the first n of that
//     order, n = min(#{w >= MinPWeight(min_p)}, top_k) and then, if top_p < 1, the smallest n
//     whose weights sum to at least TopPTarget(top_p, sum of those).
//  4. With M the kept weights' sum and t = DrawTarget(DrawBits(seed, step), M), the token is
//     the first kept id, in vocabulary order, at which the running sum of kept weights
//     exceeds t. (Drawing in vocabulary order rather than in sorted order gives each kept token
//     the same probability, w / M, and needs no sort.)
// Integer weights make every sum exact and order-free, so a parallel reduction and a serial
// loop agree; the float steps use explicitly rounded operations (no contraction into FMA).
//
// The kept set is found by radix selection on the weights (RadixSelect): a few passes over
// the row, each building a histogram of one digit of the weights.
//
// Plain C++17 (also compiled by nvcc).
#ifndef KVSERVE_KERNELS_SAMPLING_H_
#define KVSERVE_KERNELS_SAMPLING_H_

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/rounded.h"

namespace kvserve::kernels {

// One token to draw: from logits row `row`, with the request's parameters, as draw `step` of
// the random stream `seed` (a sequence's k-th token uses step k, so the same seed gives the
// same tokens whatever the batch).
struct SampleRequest {
  int32_t row = 0;
  float temperature = 0.0f;  // below kGreedyTemperature: greedy
  int32_t top_k = 0;         // <= 0, or >= the vocabulary: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  uint64_t seed = 0;
  int64_t step = 0;
};

// Draws one token per request from rows of logits (backend memory). Row r's logits may come in
// slices of `shard_vocab` ids, as a vocabulary-parallel LM head gathers them ([shard][row]
// [shard_vocab]): id i of row r is at logits[(i / shard_vocab) · num_rows · shard_vocab +
// r · shard_vocab + i % shard_vocab]. With shard_vocab == vocab (or 0) that is r · vocab + i.
struct SampleParams {
  const float* logits = nullptr;
  int64_t num_rows = 0, vocab = 0, shard_vocab = 0;
  const SampleRequest* requests = nullptr;  // backend memory
  int64_t num_requests = 0;
  int32_t* tokens = nullptr;  // backend memory: one per request
};

// Log-probabilities of drawn tokens, from the raw logits (before temperature and filters, as
// vLLM reports them), or of given ones (a prompt's): for request k, the token that sample
// `sample` drew (SampleParams::tokens), or `token` when `sample` is -1; its log-softmax value over
// logits row `row`; its rank (how many ids have a logit at least as large, itself included: 1 for
// the most likely; NaN logits count for none); and the row's `top_n` most likely ids with theirs,
// best first (the lower id first among equal logits; NaN logits last).
struct LogprobRequest {
  int32_t row = 0;
  int32_t sample = 0;  // -1: score `token`
  int32_t top_n = 0;   // the backends write at most kMaxTopLogprobs of them
  int32_t token = 0;
};

inline constexpr int kMaxTopLogprobs = 20;

struct LogprobsParams {
  const float* logits = nullptr;  // laid out as in SampleParams
  int64_t num_rows = 0, vocab = 0, shard_vocab = 0;
  const int32_t* tokens = nullptr;  // the drawn tokens (backend memory); unread when no sample
  const LogprobRequest* requests = nullptr;
  int64_t num_requests = 0;
  // Outputs (backend memory): [num_requests] each, and [num_requests][kMaxTopLogprobs] of which
  // the first top_n entries of each request are written.
  float* logprob = nullptr;
  int32_t* rank = nullptr;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;
};

inline constexpr float kGreedyTemperature = 1e-5f;
// Weights are below 2^kWeightBits (the top token weighs 2^40; rounding can add a little).
inline constexpr int kWeightBits = 41;
inline constexpr int kRadixBits = 8;
inline constexpr int kRadixBuckets = 1 << kRadixBits;

namespace sampling_internal {

KVSERVE_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace sampling_internal

// 1 / temperature, correctly rounded on both sides.
KVSERVE_HD inline float InverseTemperature(float temperature) {
  return rounded::Div(1.0f, temperature);
}

// floor(2^40 · 2^u) with u = (logit - max_logit) · inv_t · log2(e) ≤ 0, 2^frac(u) by a fixed
// polynomial. 0 below e^-30 (and for NaN).
KVSERVE_HD inline uint64_t TokenWeight(float logit, float max_logit, float inv_t) {
  using rounded::Add;
  using rounded::Mul;
  const float x = Mul(Add(logit, -max_logit), inv_t);
  if (!(x > -30.0f)) return 0;
  const float u = Mul(x, 1.44269504088896341f);
  const float n = floorf(u);
  const float f = Add(u, -n);  // exact: the fraction of u, in [0, 1]
  // 2^f = e^(f ln 2): Taylor to degree 9 (truncation error < 1e-8 on [0, 1]).
  float p = 1.01780860e-7f;
  p = Add(Mul(p, f), 1.32154867e-6f);
  p = Add(Mul(p, f), 1.52527338e-5f);
  p = Add(Mul(p, f), 1.54035304e-4f);
  p = Add(Mul(p, f), 1.33335581e-3f);
  p = Add(Mul(p, f), 9.61812911e-3f);
  p = Add(Mul(p, f), 5.55041087e-2f);
  p = Add(Mul(p, f), 2.40226507e-1f);
  p = Add(Mul(p, f), 6.93147181e-1f);
  p = Add(Mul(p, f), 1.0f);
  // p in [1, 2] has 23 fraction bits: p · 2^23 is an integer; scale it by 2^(n + 40 - 23).
  const auto m = static_cast<uint64_t>(Mul(p, 8388608.0f));
  const int shift = static_cast<int>(n) + 17;
  return shift >= 0 ? m << shift : m >> (-shift);
}

// Tokens weighing at least this pass min-p (p >= min_p · p_max).
KVSERVE_HD inline uint64_t MinPWeight(float min_p) {
  return static_cast<uint64_t>(ceil(static_cast<double>(min_p) * 1099511627776.0));
}

// ceil(top_p · kept), at least 1 and at most kept.
KVSERVE_HD inline uint64_t TopPTarget(float top_p, uint64_t kept) {
#if defined(__CUDA_ARCH__)
  const double x = __dmul_rn(static_cast<double>(top_p), __ull2double_rn(kept));
#else
  const double x = static_cast<double>(top_p) * static_cast<double>(kept);
#endif
  uint64_t t = static_cast<uint64_t>(ceil(x));
  if (t < 1) t = 1;
  return t > kept ? kept : t;
}

// Candidates: the tokens weighing at least CandidateFloor(min_w) — within about 13.9·T nats of
// the top token, and past min-p — are a prefix of the order. When the kept set lies inside them
// (CandidatesSuffice), a backend may select and draw among them only: the same token as a scan
// of the whole vocabulary, with the selection passes over at most kMaxCandidates tokens.
inline constexpr uint64_t kCandidateWeight = uint64_t{1} << 20;
inline constexpr int kMaxCandidates = 2048;

KVSERVE_HD inline uint64_t CandidateFloor(uint64_t min_w) {
  return min_w > kCandidateWeight ? min_w : kCandidateWeight;
}

// `count` / `mass`: the candidates'; `num_min_p` / `mass_min_p`: the tokens past min-p.
KVSERVE_HD inline bool CandidatesSuffice(const SampleRequest& r, uint64_t min_w, uint64_t count,
                                         uint64_t mass, uint64_t num_min_p, uint64_t mass_min_p) {
  if (count > static_cast<uint64_t>(kMaxCandidates)) return false;
  if (r.top_k > 0 && static_cast<uint64_t>(r.top_k) < num_min_p) {
    return static_cast<uint64_t>(r.top_k) <= count;  // top-k's set inside, so top-p's too
  }
  if (r.top_p < 1.0f && mass_min_p > 0) return mass >= TopPTarget(r.top_p, mass_min_p);
  return CandidateFloor(min_w) == min_w;  // min-p alone: its set is the candidates
}

// 53 uniform random bits for draw `step` of stream `seed`.
KVSERVE_HD inline uint64_t DrawBits(uint64_t seed, int64_t step) {
  using sampling_internal::SplitMix64;
  return SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(step)) >> 11;
}

// floor(bits · mass / 2^53): a target uniform in [0, mass).
KVSERVE_HD inline uint64_t DrawTarget(uint64_t bits, uint64_t mass) {
#if defined(__CUDA_ARCH__)
  const uint64_t hi = __umul64hi(bits, mass), lo = bits * mass;
#else
  const unsigned __int128 product = static_cast<unsigned __int128>(bits) * mass;
  const auto hi = static_cast<uint64_t>(product >> 64), lo = static_cast<uint64_t>(product);
#endif
  return (hi << 11) | (lo >> 53);
}

// A float as an unsigned key in the same order (-0 as +0; NaN lowest), for selecting the
// largest logits with RadixSelect (starting at bit 32).
KVSERVE_HD inline uint32_t OrderedKey(float x) {
  if (x != x) return 0;
  if (x == 0.0f) x = 0.0f;
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(x);
#else
  uint32_t bits;
  static_assert(sizeof(bits) == sizeof(x));
  __builtin_memcpy(&bits, &x, sizeof(bits));
#endif
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Where a kept set ends in the order (w descending, id ascending): token i is kept iff
// w > value, or w == value and i <= last_tie. `mass` is the kept weights' sum.
struct SampleCut {
  uint64_t value = 0;
  int64_t last_tie = 0;
  uint64_t mass = 0;
  KVSERVE_HD bool Keeps(uint64_t w, int64_t id) const {
    return w > value || (w == value && id <= last_tie);
  }
};

// Finds the first n tokens of the order by radix selection over the weights, one digit of
// kRadixBits per pass from the top: either n = target (kCount, 1 <= target <= vocabulary) or
// the smallest n whose weights sum to at least target (kMass, 1 <= target <= total weight).
// Each pass, the caller histograms the digit Digit(w) of every weight with Matches(w) (counts
// and weight sums per bucket) and hands it to Choose; after the last pass, value() is the
// weight of the n-th token and ties() how many tokens of that weight, lowest ids first, the
// set takes; tie_count() is how many tokens have that weight.
struct RadixSelect {
  enum Goal { kCount, kMass };
  Goal goal = kCount;
  uint64_t target = 1;
  int hi = kWeightBits;  // bits [hi, 64) of the selected value are fixed (32 for OrderedKey)
  uint64_t prefix = 0;
  uint64_t above_count = 0, above_sum = 0;  // tokens weighing more than the selected value
  uint64_t last_count = 0;                  // tokens in the last pass's chosen bucket

  KVSERVE_HD bool done() const { return hi == 0; }
  KVSERVE_HD int lo() const { return hi > kRadixBits ? hi - kRadixBits : 0; }
  KVSERVE_HD bool Matches(uint64_t w) const { return (w >> hi) == (prefix >> hi); }
  KVSERVE_HD int Digit(uint64_t w) const {
    return static_cast<int>((w >> lo()) & ((uint64_t{1} << (hi - lo())) - 1));
  }
  // counts[d] / sums[d]: tokens matching the prefix with digit d, and their weights.
  KVSERVE_HD void Choose(const uint32_t* counts, const uint64_t* sums) {
    const int buckets = 1 << (hi - lo());
    int d = buckets - 1;
    for (; d > 0; --d) {
      const bool enough =
          goal == kCount ? above_count + counts[d] >= target : above_sum + sums[d] >= target;
      if (enough) break;
      above_count += counts[d];
      above_sum += sums[d];
    }
    prefix |= static_cast<uint64_t>(d) << lo();
    last_count = counts[d];
    hi = lo();
  }
  KVSERVE_HD uint64_t value() const { return prefix; }
  KVSERVE_HD uint64_t ties() const {
    if (goal == kCount) return target - above_count;
    return value() == 0 ? last_count : (target - above_sum + value() - 1) / value();
  }
  KVSERVE_HD uint64_t tie_count() const { return last_count; }
  KVSERVE_HD uint64_t mass() const { return above_sum + ties() * value(); }
};

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_SAMPLING_H_
