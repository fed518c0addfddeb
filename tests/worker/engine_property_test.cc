// Property test of the engine's bookkeeping: 10,000 random requests (random lengths, n, cache
// salts, shared prefixes, some returning prompt logits) with random aborts and forced
// preemptions on a deliberately small pool. After every step the invariant checker holds; at the
// end nothing is leaked.
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

// With a host tier: swap preemption, the host prefix cache and a quantized cache too.
struct PropertyParam {
  const char* name;
  int host_blocks;
  // Steps run ahead (async scheduling): aborts and forced preemptions settle the step in flight.
  bool async = false;
};

class EnginePropertyTest : public ::testing::TestWithParam<PropertyParam> {};

TEST_P(EnginePropertyTest, RandomRequestsAbortsAndPreemptionsKeepInvariants) {
  EngineConfig config = testing::FixtureConfig("tiny-qwen3", /*num_blocks=*/48);
  config.cache.block_size = 8;
  config.max_model_len = 128;
  config.scheduler.max_num_seqs = 24;
  config.scheduler.max_num_batched_tokens = 96;
  const bool tiered = GetParam().host_blocks > 0;
  if (tiered) {
    config.cache.num_host_blocks = GetParam().host_blocks;
    config.cache.host_prefix_cache = true;
    config.cache.kv_quant = {.dtype = "int4", .granularity = "k:per_channel,v:per_token"};
  }
  config.async_scheduling = GetParam().async ? AsyncScheduling::kOn : AsyncScheduling::kOff;
  auto engine = testing::MakeEngine(config);
  ASSERT_NE(engine, nullptr);

  std::mt19937 rng(2026);
  std::vector<int32_t> shared(64);
  for (int32_t& t : shared) t = static_cast<int32_t>(rng() % 1024);
  int added = 0, aborted = 0, finished = 0, rejected_steps = 0;
  std::vector<std::string> live;
  int64_t steps = 0;
  while (added < 10000 || engine->HasWork()) {
    // Add a few requests per step.
    for (int k = rng() % 4; k > 0 && added < 10000; --k) {
      RequestInput in;
      in.request_id = "r" + std::to_string(added++);
      const int len = 1 + static_cast<int>(rng() % 60);
      if (rng() % 3 == 0) {
        in.prompt.assign(shared.begin(), shared.begin() + std::min(len, 64));
      }
      while (static_cast<int>(in.prompt.size()) < len)
        in.prompt.push_back(static_cast<int32_t>(rng() % 1024));
      in.max_tokens = 1 + static_cast<int>(rng() % 12);
      in.sampling.temperature = (rng() % 2) ? 0.8f : 0.0f;
      in.sampling.seed = rng();
      in.sampling.n = (rng() % 10 == 0) ? 2 + static_cast<int>(rng() % 3) : 1;
      in.sampling.ignore_eos = rng() % 2;
      // Prompt logits take a logits row per prompt token, out of the step's 24.
      in.return_prompt_logits = rng() % 8 == 0;
      if (rng() % 5 == 0) in.cache_salt = "s" + std::to_string(rng() % 3);
      ASSERT_OK(engine->AddRequest(in));
      live.push_back(in.request_id);
    }
    if (!live.empty() && rng() % 7 == 0) {
      const size_t i = rng() % live.size();
      if (engine->Abort(live[i]).ok()) ++aborted;
      live.erase(live.begin() + i);
    }
    if (rng() % 11 == 0) engine->TEST_ForcePreemption();
    ASSERT_OK(engine->TEST_CheckInvariants()) << "before step " << steps;
    absl::StatusOr<std::vector<SequenceOutput>> outs = engine->Step();
    ASSERT_OK(outs);
    ++steps;
    if (outs->empty() && engine->HasWork()) ++rejected_steps;
    for (const SequenceOutput& o : *outs) {
      if (o.request_finished) {
        ++finished;
        std::erase(live, o.request_id);
      }
    }
    ASSERT_OK(engine->TEST_CheckInvariants()) << "after step " << steps;
    ASSERT_LT(steps, 200000) << "no progress";
  }
  EXPECT_EQ(added, 10000);
  EXPECT_EQ(finished + aborted, 10000);
  const EngineStats s = engine->stats();
  EXPECT_GT(s.preemptions, 100);
  EXPECT_GT(s.prefix_hit_tokens, 0);
  EXPECT_GT(s.cow_copies, 0);
  EXPECT_GT(s.evictions, 0);
  if (tiered) {
    EXPECT_GT(s.swap_out_blocks, 0);
    EXPECT_GT(s.host_spilled_blocks, 0);
    EXPECT_GT(s.prefix_hit_tokens_host, 0);
    EXPECT_EQ(s.host_blocks_free, s.host_blocks_total);
    for (int b = 0; b < engine->TEST_kv_cache().host_pool()->num_blocks(); ++b) {
      ASSERT_EQ(engine->TEST_kv_cache().host_pool()->ref_count(b), 0) << "host block " << b;
    }
  }
  // Nothing leaked: every block is free again and every reference count is zero.
  EXPECT_EQ(s.blocks_free, s.blocks_total);
  EXPECT_EQ(s.num_running + s.num_waiting + s.num_requests, 0);
  for (int b = 0; b < engine->TEST_kv_cache().pool().num_blocks(); ++b) {
    ASSERT_EQ(engine->TEST_kv_cache().pool().ref_count(b), 0) << "block " << b;
  }
  ASSERT_OK(engine->TEST_CheckInvariants());
  if (GetParam().async) {
    EXPECT_GT(s.steps_ahead, s.steps / 10);
  }
  RecordProperty("steps", static_cast<int>(steps));
}

INSTANTIATE_TEST_SUITE_P(Pools, EnginePropertyTest,
                         ::testing::Values(PropertyParam{"DeviceOnly", 0},
                                           PropertyParam{"WithHostTier", 40},
                                           PropertyParam{"WithHostTierAsync", 40, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvserve::worker
