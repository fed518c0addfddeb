// logprob_token_ids (vLLM's) end to end on the fixture models (CPU backend): with logprobs on,
// each generated position reports the given ids' log-probabilities, in the given order, in place
// of the top alternatives; they equal the log-softmax of transformers' logits (first token) and
// of the engine's own raw logits (every later token); the draws do not change; every sample of
// a request shares its first row's values; the ids are validated.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

constexpr int kVocab = 1024;
const std::vector<int32_t> kIds = {3, 1023, 500, 17};  // any order: the answer keeps it

double LogZ(const float* row) {
  double max = -INFINITY, sum = 0;
  for (int i = 0; i < kVocab; ++i) max = std::max(max, static_cast<double>(row[i]));
  for (int i = 0; i < kVocab; ++i) sum += std::exp(row[i] - max);
  return max + std::log(sum);
}

double Scale(const std::vector<float>& logits) {
  float scale = 0;
  for (float l : logits) scale = std::max(scale, std::abs(l));
  return scale;
}

// `got`'s given ids against the log-softmax of `row`.
void ExpectGiven(const TokenLogprobs& got, const float* row, double tolerance,
                 const std::string& what) {
  const double log_z = LogZ(row);
  EXPECT_NEAR(got.logprob, row[got.token] - log_z, tolerance) << what << ": the drawn token";
  ASSERT_EQ(got.top.size(), kIds.size()) << what << ": the given ids, and no top alternatives";
  for (size_t k = 0; k < kIds.size(); ++k) {
    EXPECT_EQ(got.top[k].first, kIds[k]) << what;
    EXPECT_NEAR(got.top[k].second, row[kIds[k]] - log_z, tolerance) << what << " id " << kIds[k];
  }
}

RequestInput GivenIdsRequest(const std::string& id, const std::vector<int32_t>& prompt,
                             int max_tokens) {
  RequestInput in = testing::GreedyRequest(id, prompt, max_tokens);
  in.sampling.logprobs = 5;  // the count no longer matters: the given ids replace the top five
  in.sampling.logprob_token_ids = kIds;
  return in;
}

TEST(EngineLogprobIdsTest, FirstTokenEqualsTransformersLogSoftmax) {
  int checked = 0;
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    const testing::Reference ref = testing::LoadReference(model);
    auto engine = testing::MakeEngine(testing::FixtureConfig(model));
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      ASSERT_OK(engine->AddRequest(GivenIdsRequest(std::to_string(p), ref.prompts[p], 1)));
    }
    testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      const testing::SampleResult& got = r[std::to_string(p)][0];
      ASSERT_EQ(got.logprobs.size(), 1u);
      const float* last = ref.logits[p].data() + (ref.prompts[p].size() - 1) * kVocab;
      ExpectGiven(got.logprobs[0], last, 2e-4 * Scale(ref.logits[p]),  // the fixtures' 1e-4
                  std::string(model) + " prompt " + std::to_string(p));
      ++checked;
    }
  }
  EXPECT_GE(checked, 9);
}

// Every later position against the engine's raw logits of the same tokens (its prompt logits),
// and the greedy tokens are those of a request without logprobs.
TEST(EngineLogprobIdsTest, EveryPositionAndTheDrawsUnchanged) {
  const testing::Reference ref = testing::LoadReference("tiny-qwen3");
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-qwen3"));
  const std::vector<int32_t>& prompt = ref.prompts[1];
  ASSERT_OK(engine->AddRequest(GivenIdsRequest("given", prompt, 8)));
  ASSERT_OK(engine->AddRequest(testing::GreedyRequest("plain", prompt, 8)));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  const testing::SampleResult& got = r["given"][0];
  EXPECT_EQ(got.tokens, r["plain"][0].tokens);
  ASSERT_EQ(got.logprobs.size(), got.tokens.size());
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), got.tokens.begin(), got.tokens.end() - 1);
  RequestInput probe = testing::GreedyRequest("probe", all, 1);
  probe.return_prompt_logits = true;
  ASSERT_OK(engine->AddRequest(probe));
  testing::Results logits = testing::RunToCompletion(*engine);
  const std::vector<float>& rows = logits["probe"][0].prompt_logits;
  for (size_t t = 0; t < got.tokens.size(); ++t) {
    const float* row = rows.data() + (prompt.size() - 1 + t) * kVocab;
    ExpectGiven(got.logprobs[t], row, 1e-4, "position " + std::to_string(t));
  }
}

TEST(EngineLogprobIdsTest, SamplesShareTheirFirstRow) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3"));
  RequestInput in = GivenIdsRequest("n3", {5, 6, 7, 8}, 3);
  in.sampling.n = 3;
  in.sampling.temperature = 1.0f;
  in.sampling.seed = 11;
  ASSERT_OK(engine->AddRequest(in));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  ASSERT_EQ(r["n3"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(r["n3"][i].logprobs.size(), 3u) << "sample " << i;
    EXPECT_EQ(r["n3"][i].logprobs[0].top, r["n3"][0].logprobs[0].top) << "sample " << i;
  }
}

TEST(EngineLogprobIdsTest, Validated) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3"));
  auto refused = [&](RequestInput in, const std::string& says) {
    EXPECT_THAT(
        engine->AddRequest(std::move(in)),
        kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(says)));
  };
  RequestInput without = GivenIdsRequest("a", {5, 6}, 2);
  without.sampling.logprobs.reset();
  refused(without, "logprob_token_ids needs logprobs");
  RequestInput many = GivenIdsRequest("b", {5, 6}, 2);
  many.sampling.logprob_token_ids.assign(21, 4);
  refused(many, "at most 20 ids, got 21");
  RequestInput outside = GivenIdsRequest("c", {5, 6}, 2);
  outside.sampling.logprob_token_ids = {4, kVocab};
  refused(outside, "logprob_token_ids: token id 1024 is outside the vocabulary [0, 1024)");
}

}  // namespace
}  // namespace kvserve::worker
