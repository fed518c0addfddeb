// Logprobs wider than the backends' top kMaxTopLogprobs (vLLM's top_logprobs -1, the whole
// vocabulary, or a count above 20) end to end on the fixture models (CPU backend): every id of the
// vocabulary comes back, best first (the lower id first among equal logits), each the
// log-softmax of the row; the first 20 are the narrow path's; the draws do not change; prompt
// positions too; async scheduling does not run such a step ahead and gives the same answer; the
// counts are validated.
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

double LogZ(const float* row) {
  double max = -INFINITY, sum = 0;
  for (int i = 0; i < kVocab; ++i) max = std::max(max, static_cast<double>(row[i]));
  for (int i = 0; i < kVocab; ++i) sum += std::exp(row[i] - max);
  return max + std::log(sum);
}

// Every id once, best first, each row[id] - log Z; the scored token's value and rank agree.
void ExpectWholeRow(const TokenLogprobs& got, const float* row, double tolerance,
                    const std::string& what) {
  ASSERT_EQ(got.top.size(), static_cast<size_t>(kVocab)) << what;
  const double log_z = LogZ(row);
  std::vector<bool> seen(kVocab, false);
  for (size_t k = 0; k < got.top.size(); ++k) {
    const auto [id, value] = got.top[k];
    ASSERT_TRUE(id >= 0 && id < kVocab && !seen[id]) << what << ": id " << id;
    seen[id] = true;
    EXPECT_NEAR(value, row[id] - log_z, tolerance) << what << " id " << id;
    if (k > 0) {
      const auto [prev, prev_value] = got.top[k - 1];
      EXPECT_TRUE(row[prev] > row[id] || (row[prev] == row[id] && prev < id))
          << what << ": " << prev << " before " << id;
    }
  }
  const auto it = std::find_if(got.top.begin(), got.top.end(),
                               [&](const auto& e) { return e.first == got.token; });
  EXPECT_EQ(got.logprob, it->second) << what << ": the scored token's own entry";
  EXPECT_EQ(got.rank, it - got.top.begin() + 1) << what << " (no ties in these rows)";
}

RequestInput Wide(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens,
                  int logprobs) {
  RequestInput in = testing::GreedyRequest(id, prompt, max_tokens);
  in.sampling.logprobs = logprobs;
  return in;
}

TEST(EngineWideLogprobsTest, WholeVocabularyEqualsTransformersLogSoftmax) {
  for (const char* model : {"tiny-llama3", "tiny-qwen3"}) {
    const testing::Reference ref = testing::LoadReference(model);
    auto engine = testing::MakeEngine(testing::FixtureConfig(model));
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      ASSERT_OK(engine->AddRequest(Wide(std::to_string(p), ref.prompts[p], 1, -1)));
    }
    testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      const testing::SampleResult& got = r[std::to_string(p)][0];
      ASSERT_EQ(got.logprobs.size(), 1u);
      const float* last = ref.logits[p].data() + (ref.prompts[p].size() - 1) * kVocab;
      float scale = 0;
      for (float l : ref.logits[p]) scale = std::max(scale, std::abs(l));
      const std::string what = std::string(model) + " prompt " + std::to_string(p);
      ASSERT_EQ(got.logprobs[0].top.size(), static_cast<size_t>(kVocab)) << what;
      const double log_z = LogZ(last);
      for (const auto& [id, value] : got.logprobs[0].top) {
        EXPECT_NEAR(value, last[id] - log_z, 2e-4 * scale) << what << " id " << id;
      }
    }
  }
}

// `in` alone in an engine of its own: the same batch row whatever it asks, so the same logits
// bit for bit.
testing::SampleResult RunAlone(const std::string& model, const RequestInput& in) {
  auto engine = testing::MakeEngine(testing::FixtureConfig(model));
  EXPECT_OK(engine->AddRequest(in));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  return r[in.request_id][0];
}

// Every later position against the engine's own raw logits; its first 20 entries, value and
// order, are the narrow path's; the greedy tokens are those of a request without logprobs.
TEST(EngineWideLogprobsTest, EveryPositionAsTheNarrowPathAndTheDrawsUnchanged) {
  const std::string model = "tiny-qwen2";
  const std::vector<int32_t> prompt = testing::LoadReference(model).prompts[1];
  const testing::SampleResult all = RunAlone(model, Wide("all", prompt, 6, -1));
  const testing::SampleResult thirty = RunAlone(model, Wide("thirty", prompt, 6, 30));
  const testing::SampleResult twenty = RunAlone(model, Wide("twenty", prompt, 6, 20));
  const testing::SampleResult plain = RunAlone(model, testing::GreedyRequest("plain", prompt, 6));
  EXPECT_EQ(all.tokens, plain.tokens);
  EXPECT_EQ(thirty.tokens, plain.tokens);
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), all.tokens.begin(), all.tokens.end() - 1);
  RequestInput probe = testing::GreedyRequest("probe", tokens, 1);
  probe.return_prompt_logits = true;
  const std::vector<float> rows = RunAlone(model, probe).prompt_logits;
  ASSERT_EQ(all.logprobs.size(), all.tokens.size());
  for (size_t t = 0; t < all.tokens.size(); ++t) {
    const std::string what = "position " + std::to_string(t);
    ExpectWholeRow(all.logprobs[t], rows.data() + (prompt.size() - 1 + t) * kVocab, 1e-4, what);
    const TokenLogprobs& narrow = twenty.logprobs[t];
    ASSERT_EQ(thirty.logprobs[t].top.size(), 30u) << what;
    ASSERT_EQ(narrow.top.size(), 20u) << what;
    for (size_t k = 0; k < 30; ++k) {
      EXPECT_EQ(thirty.logprobs[t].top[k], all.logprobs[t].top[k]) << what << " entry " << k;
      if (k < 20) EXPECT_EQ(narrow.top[k], all.logprobs[t].top[k]) << what << " entry " << k;
    }
    EXPECT_EQ(all.logprobs[t].logprob, narrow.logprob) << what;
    EXPECT_EQ(all.logprobs[t].rank, narrow.rank) << what;
  }
}

TEST(EngineWideLogprobsTest, PromptPositionsTakeTheWholeVocabularyToo) {
  const testing::Reference ref = testing::LoadReference("tiny-llama3");
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3"));
  const std::vector<int32_t>& prompt = ref.prompts[0];
  RequestInput in = testing::GreedyRequest("scored", prompt, 1);
  in.sampling.prompt_logprobs = -1;
  ASSERT_OK(engine->AddRequest(in));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  const std::vector<TokenLogprobs>& got = r["scored"][0].prompt_logprobs;
  ASSERT_EQ(got.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const std::string what = "prompt position " + std::to_string(i + 1);
    EXPECT_EQ(got[i].token, prompt[i + 1]) << what;
    ExpectWholeRow(got[i], ref.logits[0].data() + i * kVocab, 5e-3, what);
  }
}

// A step with a wide request never runs ahead (its row comes back with the draw); a batch of
// wide and narrow requests under async scheduling answers as the serial engine does, and runs
// ahead once the wide one has finished.
TEST(EngineWideLogprobsTest, AsyncSchedulingAnswersAsSerial) {
  auto run = [](AsyncScheduling async, EngineStats* stats) {
    EngineConfig config = testing::FixtureConfig("tiny-qwen3");
    config.async_scheduling = async;
    auto engine = testing::MakeEngine(config);
    for (int i = 0; i < 4; ++i) {
      const bool wide = i == 1;
      RequestInput in =
          Wide("r" + std::to_string(i), {7, 8, 9, 10 + i}, wide ? 3 : 9, wide ? -1 : 3);
      in.sampling.temperature = 0.8f;
      in.sampling.seed = 100 + i;
      EXPECT_OK(engine->AddRequest(in));
    }
    testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
    *stats = engine->stats();
    return r;
  };
  EngineStats serial_stats, async_stats;
  const testing::Results serial = run(AsyncScheduling::kOff, &serial_stats);
  testing::Results ahead = run(AsyncScheduling::kOn, &async_stats);
  testing::ExpectSameSamples(ahead, serial, 1e-6);
  ASSERT_EQ(ahead["r1"][0].logprobs.size(), 3u);
  EXPECT_EQ(ahead["r1"][0].logprobs[2].top.size(), static_cast<size_t>(kVocab));
  EXPECT_EQ(ahead["r1"][0].logprobs[2].top, serial.at("r1").at(0).logprobs[2].top);
  EXPECT_GE(async_stats.steps_ahead, 3) << "the steps after the wide request's end";
  EXPECT_LE(async_stats.steps_ahead, async_stats.steps - 3) << "none while it ran";
}

TEST(EngineWideLogprobsTest, CountsValidated) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3"));
  auto refused = [&](RequestInput in, const std::string& says) {
    EXPECT_THAT(
        engine->AddRequest(std::move(in)),
        kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr(says)));
  };
  refused(Wide("a", {5, 6}, 2, -2),
          "logprobs must be -1 (the whole vocabulary) or in [0, 1024], got -2");
  refused(Wide("b", {5, 6}, 2, kVocab + 1), "logprobs must be -1");
  RequestInput prompt = Wide("c", {5, 6}, 2, 0);
  prompt.sampling.prompt_logprobs = -3;
  refused(prompt, "prompt_logprobs must be -1 (the whole vocabulary) or in [0, 1024], got -3");
  EXPECT_OK(engine->AddRequest(Wide("d", {5, 6}, 2, kVocab)));
}

}  // namespace
}  // namespace kvserve::worker
