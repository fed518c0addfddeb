// Prefix caching and parallel sampling through the engine: a request sharing a 300-token prefix
// with a finished one computes only its new tokens and answers as an uncached run; n = 4
// shares the prompt's blocks, copies on write, and matches four independent seeded requests.
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

using testing::FixtureConfig;
using testing::GreedyRequest;
using testing::MakeEngine;
using testing::Results;
using testing::RunToCompletion;

std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 1024);
  return t;
}

TEST(PrefixCacheTest, SharedPrefixComputesOnlyNewTokensAndAnswersTheSame) {
  const std::vector<int32_t> prefix = RandomTokens(300, 1);
  std::vector<int32_t> second = prefix;
  for (int32_t t : RandomTokens(25, 2)) second.push_back(t);

  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    SCOPED_TRACE(model);
    EngineConfig config = FixtureConfig(model);
    auto cached = MakeEngine(config);
    ASSERT_OK(cached->AddRequest(GreedyRequest("first", prefix, 8)));
    RunToCompletion(*cached, true);
    const EngineStats before = cached->stats();
    ASSERT_OK(cached->AddRequest(GreedyRequest("second", second, 16)));
    Results with_cache = RunToCompletion(*cached, true);
    const EngineStats after = cached->stats();
    // 300 tokens fill 18 blocks of 16 (288 tokens); the rest of the prompt is new.
    const int hit = 288;
    EXPECT_EQ(with_cache["second"][0].num_cached_prompt_tokens, hit);
    EXPECT_EQ(after.computed_prompt_tokens - before.computed_prompt_tokens,
              static_cast<int64_t>(second.size()) - hit);
    EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, hit);

    config.cache.enable_prefix_caching = false;
    auto uncached = MakeEngine(config);
    ASSERT_OK(uncached->AddRequest(GreedyRequest("second", second, 16)));
    Results without = RunToCompletion(*uncached, true);
    EXPECT_EQ(uncached->stats().computed_prompt_tokens, static_cast<int64_t>(second.size()));
    auto [agreed, near_tie] =
        testing::GreedyAgreement(without["second"][0], with_cache["second"][0].tokens);
    EXPECT_TRUE(agreed == 16 || near_tie) << "diverges at " << agreed;
    for (int k = 0; k < agreed; ++k) {
      EXPECT_NEAR(without["second"][0].logprobs[k].logprob,
                  with_cache["second"][0].logprobs[k].logprob, 1e-4);
    }
  }
}

TEST(PrefixCacheTest, PromptsArrivingTogetherComputeTheirSharedPrefixOnce) {
  // Four prompts of one group (a 300-token system prompt and their own questions) arrive in
  // the same step. The first computes the shared blocks; the others wait a step for them
  // instead of computing them again, then hit them.
  const std::vector<int32_t> system = RandomTokens(300, 3);
  EngineConfig config = FixtureConfig("tiny-llama3");
  auto engine = MakeEngine(config);
  int64_t total = 0;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt = system;
    for (int32_t t : RandomTokens(20, 10 + i)) prompt.push_back(t);
    total += static_cast<int64_t>(prompt.size());
    ASSERT_OK(engine->AddRequest(GreedyRequest("q" + std::to_string(i), prompt, 4)));
  }
  Results results = RunToCompletion(*engine, true);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(results["q" + std::to_string(i)][0].num_cached_prompt_tokens, 288) << i;
  }
  EXPECT_EQ(results["q0"][0].num_cached_prompt_tokens, 0);
  // 18 shared blocks (288 tokens) are computed once, not four times.
  EXPECT_EQ(engine->stats().computed_prompt_tokens, total - 3 * 288);
}

// The load routers weigh (Engine::load(), WorkerStatus.load_report): a waiting request's
// prefill is its prompt less the router's predicted cached prefix; a started one's is what it
// has left; past the prompt it is a decode row; every request reserves its prompt and output.
TEST(EngineLoadTest, CountsPrefillLeftDecodeRowsAndReservedBlocks) {
  const std::vector<int32_t> prefix = RandomTokens(300, 1);
  std::vector<int32_t> longer = prefix;
  for (int32_t t : RandomTokens(25, 2)) longer.push_back(t);
  auto engine = MakeEngine(FixtureConfig("tiny-qwen3"));
  const int bs = engine->config().cache.block_size;
  ASSERT_OK(engine->AddRequest(GreedyRequest("first", prefix, 4)));
  RunToCompletion(*engine);
  EXPECT_EQ(engine->load().requests, 0);

  RequestInput a = GreedyRequest("a", longer, 16);
  a.predicted_cached_tokens = 288;
  ASSERT_OK(engine->AddRequest(std::move(a)));
  ASSERT_OK(engine->AddRequest(GreedyRequest("b", RandomTokens(40, 3), 16)));
  Engine::Load l = engine->load();
  EXPECT_EQ(l.requests, 2);
  EXPECT_EQ(l.waiting, 2);
  EXPECT_EQ(l.decode_seqs, 0);
  EXPECT_EQ(l.prefill_tokens, (325 - 288) + 40);
  EXPECT_EQ(l.reserved_blocks, (325 + 16 + bs - 1) / bs + (40 + 16 + bs - 1) / bs);

  // Both prompts fit one step (a step ahead may be in flight with async scheduling).
  for (int i = 0; i < 3 && engine->load().decode_seqs < 2; ++i) ASSERT_OK(engine->Step().status());
  l = engine->load();
  EXPECT_EQ(l.waiting, 0);
  EXPECT_EQ(l.prefill_tokens, 0);
  EXPECT_EQ(l.decode_seqs, 2);
  RunToCompletion(*engine);
  l = engine->load();
  EXPECT_EQ(l.requests, 0);
  EXPECT_EQ(l.reserved_blocks, 0);
  EXPECT_EQ(l.decode_seqs, 0);
}

TEST(PrefixCacheTest, CacheSaltIsolatesTenants) {
  const std::vector<int32_t> prompt = RandomTokens(100, 3);
  auto engine = MakeEngine(FixtureConfig("tiny-qwen3"));
  RequestInput a = GreedyRequest("a", prompt, 2);
  a.cache_salt = "tenant-a";
  ASSERT_OK(engine->AddRequest(a));
  RunToCompletion(*engine);
  RequestInput b = GreedyRequest("b", prompt, 2);
  b.cache_salt = "tenant-b";
  ASSERT_OK(engine->AddRequest(b));
  Results r = RunToCompletion(*engine);
  EXPECT_EQ(r["b"][0].num_cached_prompt_tokens, 0);
  RequestInput c = GreedyRequest("c", prompt, 2);
  c.cache_salt = "tenant-a";
  ASSERT_OK(engine->AddRequest(c));
  r = RunToCompletion(*engine);
  EXPECT_EQ(r["c"][0].num_cached_prompt_tokens, 96);
}

TEST(ParallelSamplingTest, FourSamplesShareThePromptAndMatchIndependentRequests) {
  const std::vector<int32_t> prompt = RandomTokens(45, 4);  // 2 full blocks + a partial one
  RequestInput in;
  in.request_id = "n4";
  in.prompt = prompt;
  in.max_tokens = 20;
  in.sampling.temperature = 1.0f;
  in.sampling.top_p = 0.9f;
  in.sampling.seed = 1234;
  in.sampling.n = 4;
  in.sampling.ignore_eos = true;

  EngineConfig config = FixtureConfig("tiny-llama3");
  auto engine = MakeEngine(config);
  ASSERT_OK(engine->AddRequest(in));
  std::map<int, std::vector<int32_t>> first_tokens;
  auto step = [&] {
    absl::StatusOr<std::vector<SequenceOutput>> outs = engine->Step();
    ASSERT_OK(outs);
    for (const SequenceOutput& o : *outs) {
      first_tokens[o.sample_index].insert(first_tokens[o.sample_index].end(), o.new_tokens.begin(),
                                          o.new_tokens.end());
    }
  };
  // Step 1 prefills the prompt (3 blocks) and forks: 4 samples hold the same 3 blocks.
  step();
  ASSERT_OK(engine->TEST_CheckInvariants());
  EngineStats s = engine->stats();
  EXPECT_EQ(s.blocks_total - s.blocks_free, 3);
  EXPECT_EQ(s.num_running, 4);
  // Step 2 writes position 45 in the shared partial block: three samples copy it.
  step();
  s = engine->stats();
  EXPECT_EQ(s.cow_copies, 3);
  EXPECT_EQ(s.blocks_total - s.blocks_free, 2 + 4);  // 2 shared full blocks + 4 private ones
  Results together = RunToCompletion(*engine, true);
  for (auto& [i, tokens] : first_tokens) {
    auto& t = together["n4"][i].tokens;
    t.insert(t.begin(), tokens.begin(), tokens.end());
  }
  EXPECT_EQ(engine->stats().computed_prompt_tokens, 45);  // the prompt was computed once

  auto independent = MakeEngine(config);
  for (int i = 0; i < 4; ++i) {
    RequestInput one = in;
    one.request_id = "one" + std::to_string(i);
    one.sampling.n = 1;
    one.sampling.seed = 1234 + i;
    ASSERT_OK(independent->AddRequest(one));
  }
  Results alone = RunToCompletion(*independent, true);
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(together["n4"][i].tokens, alone["one" + std::to_string(i)][0].tokens)
        << "sample " << i;
    distinct.insert(together["n4"][i].tokens);
  }
  EXPECT_GT(distinct.size(), 1u) << "samples should differ";
}

}  // namespace
}  // namespace kvserve::worker
