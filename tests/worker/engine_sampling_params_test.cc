// The engine's logits adjustments end to end on the fixture models (CPU backend): greedy draws
// with penalties and logit_bias equal the argmax of the definitions applied, in this test, to
// transformers' logits (first token) and to the engine's own raw logits step by step (every
// token of a long continuation); min_tokens, bad_words and allowed_token_ids as vLLM defines them.
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

constexpr int kVocab = 1024;

// The definitions, written out per token: the repetition penalty over prompt and output, then
// OpenAI's frequency and presence penalties over the output; logit_bias before them.
std::vector<float> Penalize(std::vector<float> logits, const SamplingParams& s,
                            const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& output) {
  for (const auto& [id, bias] : s.logit_bias) logits[id] += bias;
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  std::map<int32_t, int> counts;
  for (int32_t t : output) {
    seen.insert(t);
    ++counts[t];
  }
  for (int32_t id : seen) {
    float& l = logits[id];
    l = l > 0 ? l / s.repetition_penalty : l * s.repetition_penalty;
  }
  for (const auto& [id, n] : counts) {
    logits[id] -= s.frequency_penalty * static_cast<float>(n);
    logits[id] -= s.presence_penalty;
  }
  return logits;
}

// The argmax of a row and its margin over the runner-up.
std::pair<int32_t, float> Top(const std::vector<float>& row) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(row.size()); ++i)
    best = row[i] > row[best] ? i : best;
  float second = -INFINITY;
  for (int32_t i = 0; i < static_cast<int32_t>(row.size()); ++i) {
    if (i != best) second = std::max(second, row[i]);
  }
  return {best, row[best] - second};
}

std::vector<float> LastRow(const std::vector<float>& logits) {
  return {logits.end() - kVocab, logits.end()};
}

// The engine's raw logits after `tokens` (the last prompt position's row).
std::vector<float> NextLogits(Engine& engine, const std::vector<int32_t>& tokens) {
  RequestInput in = testing::GreedyRequest("probe", tokens, 1);
  in.return_prompt_logits = true;
  EXPECT_OK(engine.AddRequest(in));
  testing::Results r = testing::RunToCompletion(engine);
  return LastRow(r["probe"][0].prompt_logits);
}

std::vector<int32_t> Generate(Engine& engine, RequestInput in) {
  const std::string id = in.request_id;
  EXPECT_OK(engine.AddRequest(std::move(in)));
  testing::Results r = testing::RunToCompletion(engine, /*check_invariants=*/true);
  return r[id][0].tokens;
}

SamplingParams Penalties() {
  SamplingParams s;
  s.repetition_penalty = 1.6f;
  s.frequency_penalty = 0.9f;
  s.presence_penalty = 0.7f;
  s.logit_bias = {{17, 2.5f}, {300, -4.0f}};
  return s;
}

TEST(EngineSamplingParamsTest, FirstGreedyTokenIsTheArgmaxOfTransformersLogitsAdjusted) {
  int checked = 0;
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    const testing::Reference ref = testing::LoadReference(model);
    auto engine = testing::MakeEngine(testing::FixtureConfig(model));
    for (size_t i = 0; i < ref.prompts.size(); ++i) {
      RequestInput in = testing::GreedyRequest("r", ref.prompts[i], 1);
      in.sampling = Penalties();
      const auto [want, margin] =
          Top(Penalize(LastRow(ref.logits[i]), in.sampling, ref.prompts[i], {}));
      if (margin < 1e-3f) continue;  // a near tie (the fixtures' README)
      EXPECT_EQ(Generate(*engine, in), std::vector<int32_t>{want}) << model << " prompt " << i;
      ++checked;
    }
  }
  EXPECT_GE(checked, 7);
}

// Each penalty alone, both ways, then all together: every greedy token of a continuation the
// penalties change.
TEST(EngineSamplingParamsTest, GreedyWithPenaltiesFollowsTheDefinitionsAtEveryStep) {
  std::vector<SamplingParams> variants(6, SamplingParams{});
  variants[0].presence_penalty = 2.0f;
  variants[1].presence_penalty = -2.0f;
  variants[2].frequency_penalty = 1.5f;
  variants[3].frequency_penalty = -1.0f;
  variants[4].repetition_penalty = 2.0f;
  variants[5].repetition_penalty = 0.5f;
  variants.push_back(Penalties());
  for (const char* model : {"tiny-llama3", "tiny-qwen3"}) {
    const testing::Reference ref = testing::LoadReference(model);
    auto engine = testing::MakeEngine(testing::FixtureConfig(model));
    const std::vector<int32_t>& prompt = ref.prompts[1];
    const std::vector<int32_t> plain = Generate(*engine, testing::GreedyRequest("p", prompt, 24));
    size_t changed = 0;  // a positive presence or frequency penalty changes nothing on a path
                         // that repeats no token: most variants must, though
    for (size_t v = 0; v < variants.size(); ++v) {
      SCOPED_TRACE(std::string(model) + " variant " + std::to_string(v));
      RequestInput in = testing::GreedyRequest("r", prompt, 24);
      in.sampling = variants[v];
      in.sampling.logprobs = 2;
      in.sampling.ignore_eos = true;
      const std::vector<int32_t> out = Generate(*engine, in);
      ASSERT_EQ(out.size(), 24u);
      changed += out != plain ? 1 : 0;
      std::vector<int32_t> tokens = prompt;
      size_t t = 0;
      for (; t < out.size(); ++t) {
        const std::vector<int32_t> output(out.begin(), out.begin() + static_cast<long>(t));
        const auto [want, margin] =
            Top(Penalize(NextLogits(*engine, tokens), in.sampling, prompt, output));
        if (margin < 1e-3f) break;
        ASSERT_EQ(out[t], want) << "step " << t;
        tokens.push_back(out[t]);
      }
      EXPECT_GE(t, 12u) << "a near tie stopped the comparison early";
    }
    EXPECT_GE(changed, 4u) << model << ": the penalties changed too little to show anything";
  }
}

TEST(EngineSamplingParamsTest, MinTokensHoldsBackEosAndStopIds) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3"));
  RequestInput in = testing::GreedyRequest("eos", {5, 6, 7}, 8);
  in.sampling.ignore_eos = false;
  in.sampling.allowed_token_ids = {41, 2, 40, 2};  // EOS is 2; any order, repeats allowed
  in.sampling.logit_bias = {{41, 50.0f}, {2, 1.0f}, {2, 100.0f}};  // the later bias of 2 holds
  in.stop_token_ids = {41};
  EXPECT_EQ(Generate(*engine, in), (std::vector<int32_t>{2}));
  in.request_id = "held";
  in.sampling.min_tokens = 3;
  EXPECT_EQ(Generate(*engine, in), (std::vector<int32_t>{40, 40, 40, 2}));
}

TEST(EngineSamplingParamsTest, BadWordsAreNeverGenerated) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-qwen2"));
  const std::vector<int32_t> prompt = testing::LoadReference("tiny-qwen2").prompts[0];
  const std::vector<int32_t> plain = Generate(*engine, testing::GreedyRequest("plain", prompt, 6));
  ASSERT_EQ(plain.size(), 6u);

  RequestInput one = testing::GreedyRequest("one", prompt, 6);
  one.sampling.bad_words = {{plain[0]}};
  for (int32_t t : Generate(*engine, one)) EXPECT_NE(t, plain[0]);

  RequestInput pair = testing::GreedyRequest("pair", prompt, 6);
  pair.sampling.bad_words = {{plain[0], plain[1]}};
  const std::vector<int32_t> out = Generate(*engine, pair);
  EXPECT_EQ(out[0], plain[0]);  // the word's first token alone is allowed
  EXPECT_NE(out[1], plain[1]);
  for (size_t i = 1; i < out.size(); ++i) {
    EXPECT_FALSE(out[i - 1] == plain[0] && out[i] == plain[1]) << "at " << i;
  }
}

TEST(EngineSamplingParamsTest, AllowedTokenIdsBoundSampledTokens) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-qwen3"));
  RequestInput in = testing::GreedyRequest("allowed", {9, 8, 7, 6}, 40);
  in.sampling.temperature = 1.5f;
  in.sampling.seed = 3;
  in.sampling.n = 3;
  in.sampling.allowed_token_ids = {1000, 30, 10, 20, 30};
  in.sampling.presence_penalty = 1.0f;
  EXPECT_OK(engine->AddRequest(in));
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  std::set<int32_t> drawn;
  for (const auto& [index, sample] : r["allowed"]) {
    ASSERT_EQ(sample.tokens.size(), 40u);
    for (int32_t t : sample.tokens) {
      EXPECT_TRUE(t == 10 || t == 20 || t == 30 || t == 1000) << t;
      drawn.insert(t);
    }
  }
  EXPECT_GE(drawn.size(), 3u) << "sampling drew from the allowed set";
}

}  // namespace
}  // namespace kvserve::worker
