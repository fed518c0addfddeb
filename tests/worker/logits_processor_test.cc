// From a sequence's sampling parameters to its row's logits adjustments
// (worker/logits_processor.h): bad words by vLLM's rule, min_tokens' bans, bans over biases,
// and token counts kept incrementally (prompt tokens only for the repetition penalty).
#include "worker/logits_processor.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(LogitsProcessorTest, BadWordsBanTheLastTokenAfterTheRestOfTheWord) {
  const std::vector<std::vector<int32_t>> words = {{7}, {3, 4}, {1, 2, 5}, {9, 4}};
  EXPECT_THAT(BannedByBadWords(words, {}), ElementsAre(7));
  EXPECT_THAT(BannedByBadWords(words, std::vector<int32_t>{8, 3}), ElementsAre(4, 7));
  EXPECT_THAT(BannedByBadWords(words, std::vector<int32_t>{1, 2}), ElementsAre(5, 7));
  EXPECT_THAT(BannedByBadWords(words, std::vector<int32_t>{2, 1}), ElementsAre(7));
  EXPECT_THAT(BannedByBadWords(words, std::vector<int32_t>{9}), ElementsAre(4, 7));
  EXPECT_THAT(BannedByBadWords({{3, 4}}, std::vector<int32_t>{3, 0}), IsEmpty());
}

struct Fixture {
  Request req;
  Sequence seq;
  ForwardBatch batch;
  Fixture(std::vector<int32_t> prompt, std::vector<int32_t> output) {
    seq.request = &req;
    seq.tokens = prompt;
    seq.num_prompt_tokens = static_cast<int>(prompt.size());
    seq.tokens.insert(seq.tokens.end(), output.begin(), output.end());
  }
};

TEST(LogitsProcessorTest, NothingForARequestWithoutAdjustments) {
  Fixture f({1, 2, 3}, {4});
  AddLogitsAdjustment(f.seq, 0, std::vector<int32_t>{2}, f.batch);
  EXPECT_THAT(f.batch.adjustments, IsEmpty());
}

TEST(LogitsProcessorTest, MinTokensBansEosAndStopIdsUntilReached) {
  Fixture f({1, 2, 3}, {4});
  f.req.input.stop_token_ids = {9};
  f.req.input.sampling.min_tokens = 2;
  f.req.input.sampling.logit_bias = {{2, 5.0f}, {6, -1.5f}};
  AddLogitsAdjustment(f.seq, 3, std::vector<int32_t>{2}, f.batch);
  ASSERT_EQ(f.batch.adjustments.size(), 1u);
  EXPECT_EQ(f.batch.adjustments[0].row, 3);
  std::vector<std::pair<int32_t, float>> biases;
  for (const auto& b : f.batch.biases) biases.emplace_back(b.id, b.bias);
  const float ban = -INFINITY;
  EXPECT_THAT(biases, ElementsAre(std::pair{2, ban}, std::pair{6, -1.5f}, std::pair{9, ban}));

  f.seq.tokens.push_back(5);  // two generated: EOS and 9 may come now
  f.req.input.sampling.ignore_eos = true;
  AddLogitsAdjustment(f.seq, 0, std::vector<int32_t>{2}, f.batch);
  ASSERT_EQ(f.batch.adjustments.size(), 2u);
  const auto& a = f.batch.adjustments[1];
  EXPECT_EQ(a.bias_end - a.bias_begin, 2);
}

TEST(LogitsProcessorTest, CountsCoverTheOutputAndThePromptOnlyForRepetition) {
  Fixture f({5, 6, 5}, {7, 5, 7});
  f.req.input.sampling.frequency_penalty = 0.5f;
  AddLogitsAdjustment(f.seq, 0, {}, f.batch);
  auto counts = [&](const kernels::LogitsAdjustment& a) {
    std::vector<std::tuple<int32_t, int32_t, int32_t>> out;
    for (int i = a.counts_begin; i < a.counts_end; ++i) {
      const kernels::TokenCount& c = f.batch.token_counts[i];
      out.emplace_back(c.id, c.output_count, c.in_prompt);
    }
    return out;
  };
  EXPECT_THAT(counts(f.batch.adjustments[0]),
              ElementsAre(std::tuple{7, 2, 0}, std::tuple{5, 1, 0}));
  f.seq.tokens.push_back(8);  // counted from where it left off
  AddLogitsAdjustment(f.seq, 0, {}, f.batch);
  EXPECT_THAT(counts(f.batch.adjustments[1]),
              ElementsAre(std::tuple{7, 2, 0}, std::tuple{5, 1, 0}, std::tuple{8, 1, 0}));

  Fixture r({5, 6, 5}, {7, 5});
  r.req.input.sampling.repetition_penalty = 1.3f;
  AddLogitsAdjustment(r.seq, 0, {}, r.batch);
  std::vector<std::tuple<int32_t, int32_t, int32_t>> got;
  for (const auto& c : r.batch.token_counts) got.emplace_back(c.id, c.output_count, c.in_prompt);
  EXPECT_THAT(got, ElementsAre(std::tuple{5, 1, 1}, std::tuple{6, 0, 1}, std::tuple{7, 1, 0}));
  EXPECT_EQ(r.batch.adjustments[0].repetition_penalty, 1.3f);
}

TEST(LogitsProcessorTest, AllowedIdsAreCopiedForTheRow) {
  Fixture f({1}, {});
  f.req.input.sampling.allowed_token_ids = {3, 8, 11};
  AddLogitsAdjustment(f.seq, 0, {}, f.batch);
  AddLogitsAdjustment(f.seq, 1, {}, f.batch);
  ASSERT_EQ(f.batch.adjustments.size(), 2u);
  EXPECT_EQ(f.batch.adjustments[1].allowed_begin, 3);
  EXPECT_EQ(f.batch.adjustments[1].allowed_end, 6);
  EXPECT_THAT(f.batch.allowed_ids, ElementsAre(3, 8, 11, 3, 8, 11));
}

}  // namespace
}  // namespace kvserve::worker
