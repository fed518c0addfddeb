// The CPU twin of the logits adjustments (kernels/cpu/logits_processing.h) against the
// definitions, written here per id from sets and maps: vLLM's order (allowed ids and bitmasks,
// biases, penalties), the CTRL repetition penalty over prompt and output, OpenAI's frequency and
// presence penalties over the output, on whole rows and on vocabulary slices.
#include "kernels/cpu/logits_processing.h"

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/logits_cases.h"
#include "tests/kernels/sampling_cases.h"

namespace kvserve::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The row of `a` after its adjustments, id by id, from the original `row`.
std::vector<float> Expected(const std::vector<float>& row, const LogitsAdjustment& a,
                            const LogitsCase& c) {
  const std::set<int32_t> allowed(c.allowed_ids.begin() + a.allowed_begin,
                                  c.allowed_ids.begin() + a.allowed_end);
  std::map<int32_t, float> bias;
  for (int i = a.bias_begin; i < a.bias_end; ++i) bias[c.biases[i].id] = c.biases[i].bias;
  std::map<int32_t, TokenCount> counts;
  for (int i = a.counts_begin; i < a.counts_end; ++i) counts[c.counts[i].id] = c.counts[i];
  std::vector<float> out = row;
  for (int32_t id = 0; id < static_cast<int32_t>(row.size()); ++id) {
    float v = row[id];
    if (!allowed.empty() && allowed.count(id) == 0) v = -kInf;
    if (a.mask_begin >= 0 && ((c.mask_words[a.mask_begin + id / 32] >> (id % 32)) & 1) == 0) {
      v = -kInf;
    }
    if (auto it = bias.find(id); it != bias.end()) v += it->second;
    if (auto it = counts.find(id); it != counts.end()) {
      const TokenCount& t = it->second;
      const bool seen = t.in_prompt != 0 || t.output_count > 0;
      if (seen) v = v > 0 ? v / a.repetition_penalty : v * a.repetition_penalty;
      if (t.output_count > 0) {
        const float frequency = a.frequency_penalty * static_cast<float>(t.output_count);
        v -= frequency;
        v -= a.presence_penalty;
      }
    }
    out[id] = v;
  }
  return out;
}

std::vector<float> RowAt(const std::vector<float>& logits, const SamplingCase& sc, int64_t r) {
  std::vector<float> row(sc.vocab);
  for (int64_t i = 0; i < sc.vocab; ++i) {
    row[i] = logits[(i / sc.shard) * sc.rows * sc.shard + r * sc.shard + i % sc.shard];
  }
  return row;
}

void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want, int64_t r) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "row " << r << " id " << i;
    } else {
      ASSERT_EQ(got[i], want[i]) << "row " << r << " id " << i;
    }
  }
}

TEST(LogitsProcessingTest, EveryRowMatchesTheDefinitions) {
  std::mt19937 rng(11);
  for (const SamplingCase& sc :
       {SamplingCase{6, 1000, 1000, false}, SamplingCase{5, 5000, 1280, false},
        SamplingCase{4, 300, 300, true}}) {
    SCOPED_TRACE(sc.Name());
    std::vector<float> logits = SamplingLogits(sc, rng);
    const std::vector<float> before = logits;
    const LogitsCase c = RandomLogitsCase(sc.rows, sc.vocab, rng);
    cpu::AdjustLogits(c.Params(logits.data(), sc.rows, sc.vocab, sc.shard));
    for (int64_t r = 0; r < sc.rows; ++r) {
      const std::vector<float> got = RowAt(logits, sc, r);
      const std::vector<float> original = RowAt(before, sc, r);
      const LogitsAdjustment* a = nullptr;
      for (const LogitsAdjustment& x : c.rows) a = x.row == r ? &x : a;
      ExpectSameBits(got, a == nullptr ? original : Expected(original, *a, c), r);
    }
  }
}

TEST(LogitsProcessingTest, RepetitionDividesPositivesAndMultipliesNegatives) {
  std::vector<float> logits = {2.0f, -2.0f, 3.0f, 1.0f};
  const LogitsCase c{.rows = {{.row = 0,
                               .repetition_penalty = 2.0f,
                               .frequency_penalty = 0.5f,
                               .presence_penalty = 0.25f,
                               .counts_begin = 0,
                               .counts_end = 3}},
                     .counts = {{0, 0, 1}, {1, 0, 1}, {2, 3, 0}}};
  cpu::AdjustLogits(c.Params(logits.data(), 1, 4, 4));
  // id 0: prompt only, 2 / 2; id 1: prompt only, -2 · 2; id 2: three times in the output,
  // 3 / 2 - 0.5 · 3 - 0.25; id 3 untouched.
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.0f, -0.25f, 1.0f}));
}

TEST(LogitsProcessingTest, AllowedIdsLeaveOnlyThemAndBansWinOverBiases) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  const LogitsCase c{
      .rows = {{.row = 0, .allowed_begin = 0, .allowed_end = 2, .bias_begin = 0, .bias_end = 2}},
      .allowed_ids = {1, 3},
      .biases = {{1, -kInf}, {3, 10.0f}}};
  cpu::AdjustLogits(c.Params(logits.data(), 1, 5, 5));
  EXPECT_EQ(logits, (std::vector<float>{-kInf, -kInf, -kInf, 14.0f, -kInf}));
}

}  // namespace
}  // namespace kvserve::kernels
