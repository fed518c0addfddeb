// prompt_logprobs end to end on the fixture models (CPU backend): each prompt token's
// log-probability, rank and top alternatives equal those of transformers' logits (the fixtures'
// tolerance), whether the prompt is prefilled at once or in chunks, and whether or not its
// blocks are in the prefix cache (such a request computes every position).
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
constexpr int kTop = 5;

RequestInput PromptLogprobsRequest(const std::string& id, const std::vector<int32_t>& prompt) {
  RequestInput in = testing::GreedyRequest(id, prompt, 2);
  in.sampling.prompt_logprobs = kTop;
  return in;
}

// The definitions, from one row of reference logits: log-softmax at `token`, the ids with a
// logit at least the token's, the best kTop ids.
struct Expected {
  double logprob = 0;
  int rank = 0;
  std::vector<int32_t> top;
  double log_z = 0;
  float gap = 0;  // the smallest logit gap around the token and within the top: ties below it
};

Expected Reference(const float* row, int32_t token) {
  Expected e;
  double max = -INFINITY, sum = 0;
  for (int i = 0; i < kVocab; ++i) max = std::max(max, static_cast<double>(row[i]));
  for (int i = 0; i < kVocab; ++i) sum += std::exp(row[i] - max);
  e.log_z = max + std::log(sum);
  e.logprob = row[token] - e.log_z;
  std::vector<int32_t> order(kVocab);
  for (int i = 0; i < kVocab; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
  e.top.assign(order.begin(), order.begin() + kTop);
  e.gap = INFINITY;
  for (int i = 0; i < kVocab; ++i) {
    e.rank += row[i] >= row[token] ? 1 : 0;
    if (i != token) e.gap = std::min(e.gap, std::abs(row[i] - row[token]));
  }
  for (int i = 0; i < kTop; ++i) e.gap = std::min(e.gap, row[order[i]] - row[order[i + 1]]);
  return e;
}

// Every prompt position of `got` against the reference logits of prompt `p`.
int ExpectMatches(const std::vector<TokenLogprobs>& got, const testing::Reference& ref, size_t p,
                  const std::string& what) {
  const std::vector<int32_t>& prompt = ref.prompts[p];
  EXPECT_EQ(got.size(), prompt.size() - 1) << what;
  if (got.size() != prompt.size() - 1) return 0;
  float scale = 0;
  for (float l : ref.logits[p]) scale = std::max(scale, std::abs(l));
  const double tolerance = 2e-4 * scale;  // the fixtures' 1e-4 on the logit and on log Z
  int exact = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const Expected e = Reference(ref.logits[p].data() + i * kVocab, prompt[i + 1]);
    EXPECT_EQ(got[i].token, prompt[i + 1]) << what << " position " << i;
    EXPECT_NEAR(got[i].logprob, e.logprob, tolerance) << what << " position " << i;
    EXPECT_EQ(got[i].top.size(), static_cast<size_t>(kTop)) << what;
    if (got[i].top.size() != static_cast<size_t>(kTop)) continue;
    for (int k = 0; k < kTop; ++k) {
      EXPECT_NEAR(got[i].top[k].second, ref.logits[p][i * kVocab + got[i].top[k].first] - e.log_z,
                  tolerance)
          << what << " position " << i << " alternative " << k;
    }
    if (e.gap < 1e-3f * scale) continue;  // a near tie: the order may differ (fixtures' README)
    EXPECT_EQ(got[i].rank, e.rank) << what << " position " << i;
    for (int k = 0; k < kTop; ++k) EXPECT_EQ(got[i].top[k].first, e.top[k]) << what << " " << i;
    ++exact;
  }
  return exact;
}

TEST(EnginePromptLogprobsTest, EqualTransformersLogSoftmax) {
  int exact = 0;
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    const testing::Reference ref = testing::LoadReference(model);
    auto engine = testing::MakeEngine(testing::FixtureConfig(model));
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      ASSERT_OK(engine->AddRequest(PromptLogprobsRequest(std::to_string(p), ref.prompts[p])));
    }
    testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      const testing::SampleResult& got = r[std::to_string(p)][0];
      exact += ExpectMatches(got.prompt_logprobs, ref, p,
                             std::string(model) + " prompt " + std::to_string(p));
      EXPECT_EQ(got.tokens.size(), 2u) << "and it still generates";
    }
  }
  EXPECT_GE(exact, 100) << "positions whose rank and top ids were checked";
}

// Chunked prefill (8 tokens a step) and a prompt whose blocks are cached: the same values, and
// the request reports no cached tokens (it computed them).
TEST(EnginePromptLogprobsTest, ChunksAndPrefixCacheHitsChangeNothing) {
  const testing::Reference ref = testing::LoadReference("tiny-llama3");
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.scheduler.max_num_batched_tokens = 8;
  config.cache.enable_prefix_caching = true;
  auto engine = testing::MakeEngine(config);
  size_t longest = 0;
  for (size_t p = 1; p < ref.prompts.size(); ++p) {
    if (ref.prompts[p].size() > ref.prompts[longest].size()) longest = p;
  }
  ASSERT_GT(ref.prompts[longest].size(), 2u * config.cache.block_size) << "blocks to cache";
  ASSERT_OK(engine->AddRequest(testing::GreedyRequest("warm", ref.prompts[longest], 1)));
  testing::RunToCompletion(*engine);
  ASSERT_OK(engine->AddRequest(testing::GreedyRequest("hit", ref.prompts[longest], 1)));
  testing::Results hit = testing::RunToCompletion(*engine);
  EXPECT_GT(hit["hit"][0].num_cached_prompt_tokens, 0) << "the prompt's blocks are cached";
  ASSERT_OK(engine->AddRequest(PromptLogprobsRequest("scored", ref.prompts[longest])));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  EXPECT_EQ(r["scored"][0].num_cached_prompt_tokens, 0);
  EXPECT_GE(ExpectMatches(r["scored"][0].prompt_logprobs, ref, longest, "chunked"), 1);
}

// With n > 1 the prompt's logprobs come once, on the request's first output; a one-token prompt
// has none; the count is bounded like logprobs.
TEST(EnginePromptLogprobsTest, OncePerRequestAndValidated) {
  const testing::Reference ref = testing::LoadReference("tiny-qwen3");
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-qwen3"));
  RequestInput in = PromptLogprobsRequest("n3", ref.prompts[0]);
  in.sampling.n = 3;
  in.sampling.temperature = 1.0f;
  ASSERT_OK(engine->AddRequest(in));
  ASSERT_OK(engine->AddRequest(PromptLogprobsRequest("one", {ref.prompts[0][0]})));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  EXPECT_EQ(r["n3"][0].prompt_logprobs.size(), ref.prompts[0].size() - 1);
  EXPECT_EQ(r["n3"].size(), 3u);
  EXPECT_TRUE(r["one"][0].prompt_logprobs.empty());
  EXPECT_EQ(r["one"][0].tokens.size(), 2u);
  for (int bad : {-2, 1025}) {  // -1: the whole vocabulary (engine_wide_logprobs_test)
    RequestInput b = PromptLogprobsRequest("bad", ref.prompts[0]);
    b.sampling.prompt_logprobs = bad;
    EXPECT_THAT(engine->AddRequest(b),
                kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("prompt_logprobs")));
  }
}

}  // namespace
}  // namespace kvserve::worker
