// The sampling rule (kernels/sampling.h) and its CPU twin: the twin's radix selection against a
// straightforward sort of the vocabulary, on rows built to have many ties; the weight function
// against exp; the vocabulary-sliced layout against the contiguous one.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve::kernels {
namespace {

// The rule as kernels/sampling.h states it, by sorting. `kept` receives the kept ids' mask and
// `mass` their weight.
int32_t SortedReference(const std::vector<float>& logits, const SampleRequest& r,
                        std::vector<bool>* kept = nullptr, uint64_t* kept_mass = nullptr) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  }
  if (best < 0) best = 0;
  if (!(r.temperature >= kGreedyTemperature)) return static_cast<int32_t>(best);
  const float max = std::isnan(logits[best]) ? -INFINITY : logits[best];
  std::vector<uint64_t> w(vocab);
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = TokenWeight(logits[i], max, InverseTemperature(r.temperature));
  }
  std::vector<int64_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
  int64_t n = 0;
  while (n < vocab && w[order[n]] >= MinPWeight(r.min_p)) ++n;
  if (r.top_k > 0) n = std::min<int64_t>(n, r.top_k);
  uint64_t mass = 0;
  for (int64_t i = 0; i < n; ++i) mass += w[order[i]];
  if (r.top_p < 1.0f && mass > 0) {
    const uint64_t target = TopPTarget(r.top_p, mass);
    mass = 0;
    int64_t m = 0;
    while (mass < target) mass += w[order[m++]];
    n = m;
  }
  if (kept != nullptr) {
    kept->assign(vocab, false);
    for (int64_t i = 0; i < n; ++i) (*kept)[order[i]] = true;
    *kept_mass = mass;
  }
  if (mass == 0) return static_cast<int32_t>(best);
  std::vector<int64_t> ids(order.begin(), order.begin() + n);
  std::sort(ids.begin(), ids.end());
  const uint64_t target = DrawTarget(DrawBits(r.seed, r.step), mass);
  uint64_t sum = 0;
  for (int64_t id : ids) {
    sum += w[id];
    if (sum > target) return static_cast<int32_t>(id);
  }
  ADD_FAILURE() << "target " << target << " not below mass " << mass;
  return -1;
}

SampleRequest RandomRequest(std::mt19937& rng, int64_t vocab) {
  SampleRequest r;
  r.row = 0;
  r.temperature = std::uniform_int_distribution<int>(0, 9)(rng) == 0
                      ? 0.0f
                      : std::uniform_real_distribution<float>(0.05f, 2.0f)(rng);
  const int k = std::uniform_int_distribution<int>(0, 4)(rng);
  r.top_k = k == 0   ? 0
            : k == 1 ? 1
            : k == 2 ? static_cast<int32_t>(vocab + 5)
                     : std::uniform_int_distribution<int>(1, 50)(rng);
  r.top_p = std::uniform_int_distribution<int>(0, 2)(rng) == 0
                ? 1.0f
                : std::uniform_real_distribution<float>(0.001f, 0.999f)(rng);
  r.min_p = std::uniform_int_distribution<int>(0, 2)(rng) == 0
                ? 0.0f
                : std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
  r.seed = rng();
  r.step = std::uniform_int_distribution<int64_t>(0, 1 << 20)(rng);
  return r;
}

// Logits from a few distinct values (many exact weight ties) or spread normally.
std::vector<float> RandomLogits(std::mt19937& rng, int64_t vocab, bool ties) {
  std::vector<float> l(vocab);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> level(0, 5);
  for (float& x : l) x = ties ? 0.5f * static_cast<float>(level(rng)) : normal(rng);
  return l;
}

// `rows` rows of random logits, and the same laid out in vocabulary slices of `shard` ids as a
// tensor-parallel LM head gathers them ([slice][row][shard], NaN padding).
struct SlicedRows {
  std::vector<std::vector<float>> rows;
  std::vector<float> sliced;
};
SlicedRows MakeSlicedRows(std::mt19937& rng, int64_t rows, int64_t vocab, int64_t shard) {
  SlicedRows out;
  const int64_t slices = (vocab + shard - 1) / shard;
  out.sliced.assign(slices * rows * shard, NAN);
  for (int64_t r = 0; r < rows; ++r) {
    out.rows.push_back(RandomLogits(rng, vocab, r == 1));
    for (int64_t i = 0; i < vocab; ++i) {
      out.sliced[(i / shard) * rows * shard + r * shard + i % shard] = out.rows[r][i];
    }
  }
  return out;
}

TEST(SamplingTest, TwinMatchesTheSortedDefinition) {
  std::mt19937 rng(11);
  int sampled = 0;
  for (int64_t vocab : {1, 2, 3, 17, 300, 5000}) {
    for (int trial = 0; trial < 300; ++trial) {
      const std::vector<float> logits = RandomLogits(rng, vocab, trial % 2 == 0);
      const SampleRequest r = RandomRequest(rng, vocab);
      ASSERT_EQ(cpu::SampleRow(logits.data(), vocab, r), SortedReference(logits, r))
          << "vocab " << vocab << " trial " << trial << " T " << r.temperature << " top_k "
          << r.top_k << " top_p " << r.top_p << " min_p " << r.min_p;
      sampled += r.temperature > 0;
    }
  }
  EXPECT_GT(sampled, 1000);
}

// The kept set itself, not only the drawn token (a wrong set rarely changes the token when the
// tokens it adds or drops weigh little): on rows built so that the top few tokens stand far
// above a long tail — the candidates then hold some answers and not others (a top-k reaching
// into the tail, a min-p below the candidate floor) — and on the random rows.
TEST(SamplingTest, TwinKeepsTheSetTheRuleKeeps) {
  std::mt19937 rng(17);
  int with_tail = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int64_t vocab = trial % 3 == 0 ? 3000 : 400;
    std::vector<float> logits = RandomLogits(rng, vocab, trial % 5 == 0);
    if (trial % 2 == 1) {  // a few tokens far above a tail ~15-25 nats down
      std::uniform_real_distribution<float> tail(-25.0f, -12.0f);
      for (float& x : logits) x = tail(rng);
      for (int k = 0; k < 1 + trial % 7; ++k) logits[rng() % vocab] = 0.5f * static_cast<float>(k);
    }
    SampleRequest r = RandomRequest(rng, vocab);
    if (r.temperature == 0.0f) r.temperature = 1.0f;
    if (trial % 4 == 1) r.top_k = 5 + static_cast<int32_t>(rng() % 40);  // into the tail
    if (trial % 8 == 3) r.min_p = 1e-9f;                                 // below the floor
    std::vector<bool> want;
    uint64_t want_mass = 0;
    SortedReference(logits, r, &want, &want_mass);
    SampleCut cut;
    cpu::SampleRow(logits.data(), vocab, r, &cut);
    ASSERT_EQ(cut.mass, want_mass) << "trial " << trial;
    const float inv_t = InverseTemperature(r.temperature);
    const float max = *std::max_element(logits.begin(), logits.end());
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(cut.Keeps(TokenWeight(logits[i], max, inv_t), i), want[i])
          << "trial " << trial << " token " << i << " w " << TokenWeight(logits[i], max, inv_t)
          << " cut " << cut.value << "/" << cut.last_tie << " T " << r.temperature << " k "
          << r.top_k << " p " << r.top_p << " min_p " << r.min_p;
    }
    with_tail += trial % 2 == 1;
  }
  EXPECT_GT(with_tail, 250);
}

TEST(SamplingTest, GreedyIsTheLowestIdAmongMaxima) {
  SampleRequest r;
  std::vector<float> l = {2, 5, 5, NAN, 1};
  EXPECT_EQ(cpu::SampleRow(l.data(), 5, r), 1);
  l = {NAN, NAN};
  EXPECT_EQ(cpu::SampleRow(l.data(), 2, r), 0);
  l = {NAN, -INFINITY, -INFINITY};
  EXPECT_EQ(cpu::SampleRow(l.data(), 3, r), 1);
  r.temperature = 1.0f;  // every weight 0 (NaN or -inf against -inf): falls back to the argmax
  EXPECT_EQ(cpu::SampleRow(l.data(), 3, r), 1);
}

TEST(SamplingTest, WeightFollowsExp) {
  EXPECT_EQ(TokenWeight(3.0f, 3.0f, 1.0f), uint64_t{1} << 40);
  uint64_t previous = 0;
  for (float x = -31.0f; x <= 0.0f; x += 1.0f / 1024) {
    const uint64_t w = TokenWeight(x, 0.0f, 1.0f);
    ASSERT_GE(w, previous) << x;  // monotone
    previous = w;
    const double exact = std::ldexp(std::exp(static_cast<double>(x)), 40);
    ASSERT_NEAR(static_cast<double>(w), exact, 1.0 + 2e-6 * exact) << x;  // w is an integer
    ASSERT_LT(w, uint64_t{1} << kWeightBits);
  }
  EXPECT_EQ(TokenWeight(-30.5f, 0.0f, 1.0f), 0u);
  EXPECT_EQ(TokenWeight(NAN, 0.0f, 1.0f), 0u);
  EXPECT_EQ(TokenWeight(-1.0f, 0.0f, InverseTemperature(2.0f)), TokenWeight(-0.5f, 0.0f, 1.0f));
}

TEST(SamplingTest, DrawTargetIsBelowTheMass) {
  for (uint64_t mass : {uint64_t{1}, uint64_t{3}, uint64_t{1} << 40, (uint64_t{1} << 58) - 1}) {
    EXPECT_EQ(DrawTarget(0, mass), 0u);
    EXPECT_LT(DrawTarget((uint64_t{1} << 53) - 1, mass), mass);
    EXPECT_EQ(DrawTarget(uint64_t{1} << 52, mass), mass / 2);
  }
}

TEST(SamplingTest, FrequenciesFollowTheFilteredSoftmax) {
  // top_k 3 of {3.0, 2.9, 2.0, 1.0, 0.5} at T = 0.7: ids 1, 4, 2 with softmax weights.
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};
  SampleRequest r;
  r.temperature = 0.7f;
  r.top_k = 3;
  r.seed = 5;
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) {
    r.step = i;
    ++counts[cpu::SampleRow(logits.data(), 5, r)];
  }
  double z = 0;
  for (int id : {1, 4, 2}) z += std::exp(logits[id] / 0.7);
  for (int id : {1, 4, 2}) {
    EXPECT_NEAR(counts[id] / double{n}, std::exp(logits[id] / 0.7) / z, 0.01) << id;
  }
  EXPECT_EQ(counts[0] + counts[3], 0);
}

TEST(SamplingTest, SlicedRowsDrawLikeContiguousOnes) {
  std::mt19937 rng(5);
  const int64_t rows = 3, vocab = 1000, shard = 256;  // 4 slices, the last one short
  auto [logits, sliced] = MakeSlicedRows(rng, rows, vocab, shard);
  std::vector<SampleRequest> requests;
  for (int k = 0; k < 60; ++k) {
    requests.push_back(RandomRequest(rng, vocab));
    requests.back().row = k % rows;
  }
  std::vector<int32_t> tokens(requests.size(), -1);
  SampleParams p;
  p.logits = sliced.data();
  p.num_rows = rows;
  p.vocab = vocab;
  p.shard_vocab = shard;
  p.requests = requests.data();
  p.num_requests = static_cast<int64_t>(requests.size());
  p.tokens = tokens.data();
  cpu::Sample(p);
  for (size_t k = 0; k < requests.size(); ++k) {
    EXPECT_EQ(tokens[k], cpu::SampleRow(logits[requests[k].row].data(), vocab, requests[k])) << k;
  }
}

TEST(SamplingTest, LogprobsAreLogSoftmaxOfRawLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, 3.0f};
  float logprob = 0;
  int32_t rank = 0, ids[3];
  float values[3];
  cpu::TopLogprobs(logits.data(), 6, 2, 3, &logprob, &rank, ids, values);
  EXPECT_EQ(rank, 4);  // 3.0, 3.0 and 2.9 are larger
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(logprob, 2.0 - std::log(z), 1e-6);
  EXPECT_EQ(ids[0], 1);  // 3.0 twice: the lower id first
  EXPECT_EQ(ids[1], 5);
  EXPECT_EQ(ids[2], 4);
  EXPECT_NEAR(values[0], 3.0 - std::log(z), 1e-6);
  EXPECT_NEAR(values[1] - values[2], 0.1, 1e-6);
  cpu::TopLogprobs(logits.data(), 6, 5, 0, &logprob, &rank, ids, values);
  EXPECT_EQ(rank, 2) << "ties count";
}

// Logprobs read the tokens the draws produced and the same sliced layout as sampling.
TEST(SamplingTest, LogprobsFollowTheDrawsOverSlicedRows) {
  std::mt19937 rng(4);
  const int64_t rows = 2, vocab = 700, shard = 256;
  auto [logits, sliced] = MakeSlicedRows(rng, rows, vocab, shard);
  const std::vector<int32_t> tokens = {17, 650, 3};
  // The last scores a given token (a prompt's), not a draw.
  const std::vector<LogprobRequest> requests = {{0, 1, 5}, {1, 0, 20}, {1, 2, 0}, {0, -1, 3, 699}};
  const int n = static_cast<int>(requests.size());
  std::vector<float> logprob(n), top_values(n * kMaxTopLogprobs);
  std::vector<int32_t> top_ids(n * kMaxTopLogprobs, -1), rank(n);
  LogprobsParams p;
  p.logits = sliced.data();
  p.num_rows = rows;
  p.vocab = vocab;
  p.shard_vocab = shard;
  p.tokens = tokens.data();
  p.requests = requests.data();
  p.num_requests = n;
  p.logprob = logprob.data();
  p.rank = rank.data();
  p.top_ids = top_ids.data();
  p.top_logprobs = top_values.data();
  cpu::Logprobs(p);
  for (int k = 0; k < n; ++k) {
    const LogprobRequest& q = requests[k];
    float want = 0;
    int32_t want_rank = 0, ids[kMaxTopLogprobs];
    float values[kMaxTopLogprobs];
    const int32_t token = q.sample >= 0 ? tokens[q.sample] : q.token;
    cpu::TopLogprobs(logits[q.row].data(), vocab, token, q.top_n, &want, &want_rank, ids, values);
    EXPECT_EQ(logprob[k], want) << k;
    EXPECT_EQ(rank[k], want_rank) << k;
    for (int i = 0; i < q.top_n; ++i) {
      EXPECT_EQ(top_ids[k * kMaxTopLogprobs + i], ids[i]) << k << " " << i;
      EXPECT_EQ(top_values[k * kMaxTopLogprobs + i], values[i]) << k << " " << i;
    }
  }
  EXPECT_EQ(top_ids[2 * kMaxTopLogprobs], -1);  // top_n 0 writes nothing
}

}  // namespace
}  // namespace kvserve::kernels
