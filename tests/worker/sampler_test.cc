#include "worker/sampler.h"

#include <cmath>
#include <map>

#include "gtest/gtest.h"
#include "kernels/cpu/sampling.h"

namespace kvserve::worker {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};

int32_t SampleToken(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed,
                    int64_t step) {
  return kernels::cpu::SampleRow(logits.data(), static_cast<int64_t>(logits.size()),
                                 MakeSampleRequest(p, seed, step, 0));
}

TEST(SamplerTest, GreedyIsArgmaxWithFirstIndexOnTies) {
  SamplingParams p;
  EXPECT_EQ(SampleToken(kLogits, p, 1, 0), 1);
  std::vector<float> tie = {2, 5, 5};
  EXPECT_EQ(SampleToken(tie, p, 1, 0), 1);
}

TEST(SamplerTest, SameSeedSameDraws) {
  SamplingParams p;
  p.temperature = 1.0f;
  for (int step = 0; step < 50; ++step) {
    EXPECT_EQ(SampleToken(kLogits, p, 42, step), SampleToken(kLogits, p, 42, step));
  }
  int differ = 0;
  for (int step = 0; step < 50; ++step)
    differ += SampleToken(kLogits, p, 42, step) != SampleToken(kLogits, p, 43, step);
  EXPECT_GT(differ, 5);
}

TEST(SamplerTest, FiltersNarrowTheChoice) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  for (int s = 0; s < 100; ++s) EXPECT_EQ(SampleToken(kLogits, p, s, 0), 1);
  p.top_k = 2;
  for (int s = 0; s < 100; ++s) {
    int t = SampleToken(kLogits, p, s, 0);
    EXPECT_TRUE(t == 1 || t == 4);
  }
  p = SamplingParams();
  p.temperature = 1.0f;
  p.top_p = 0.01f;
  for (int s = 0; s < 100; ++s) EXPECT_EQ(SampleToken(kLogits, p, s, 0), 1);
  p = SamplingParams();
  p.temperature = 1.0f;
  p.min_p =
      0.5f;  // keeps tokens with p >= 0.5 p_max: ids 1 (3.0), 4 (2.9), 2 (2.0 → e^-1 = 0.37: out)
  for (int s = 0; s < 100; ++s) {
    int t = SampleToken(kLogits, p, s, 0);
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  SamplingParams p;
  p.temperature = 0.7f;
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[SampleToken(kLogits, p, 7, i)];
  double z = 0;
  for (float l : kLogits) z += std::exp(l / 0.7);
  for (int t = 0; t < 5; ++t) {
    const double expected = std::exp(kLogits[t] / 0.7) / z;
    EXPECT_NEAR(counts[t] / double{n}, expected, 0.01) << "token " << t;
  }
}

}  // namespace
}  // namespace kvserve::worker
