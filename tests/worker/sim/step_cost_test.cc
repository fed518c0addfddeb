// The simulated GPU's step time: the roofline formula by hand for a Llama-3-8B shape, the bound
// that wins in decode (memory) and in long prefill (compute), and an engine on --device sim
// whose reported busy time is the sum of the formula over the steps it ran.
#include "worker/sim/step_cost.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "worker/engine.h"

namespace kvserve::worker {
namespace {

ModelConfig Llama3_8B() {
  ModelConfig m;
  m.vocab_size = 128256;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_layers = 32;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  return m;
}

// bf16 KV: 32 layers × (K + V) × 8 heads × 128 × 2 bytes.
constexpr double kKvBytesPerToken = 32.0 * 2 * 8 * 128 * 2;

TEST(StepCostTest, TheShapeOfLlama3_8B) {
  const SimModel s = SimModelOf(Llama3_8B(), 2, kKvBytesPerToken);
  // 6.98e9 parameters in the layers' matmuls, 0.53e9 in the LM head: the 8B of the name less
  // the embedding table.
  EXPECT_EQ(s.matmul_params,
            32LL * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336));
  EXPECT_EQ(s.lm_head_params, 4096LL * 128256);
  EXPECT_EQ(s.weight_bytes, 2 * (s.matmul_params + s.lm_head_params));
  EXPECT_EQ(s.attention_width, 32 * 32 * 128);
}

TEST(StepCostTest, DecodeIsBoundByMemoryAndMatchesTheFormula) {
  const SimModel s = SimModelOf(Llama3_8B(), 2, kKvBytesPerToken);
  ASSERT_OK_AND_ASSIGN(GpuProfile h200, GpuPreset("h200"));
  // 32 sequences of 4096 cached tokens, one new token each.
  const std::vector<int32_t> q(32, 1), ctx(32, 4097);
  const StepCost c = EstimateStep(s, h200, {.query_len = q, .context_len = ctx, .logit_rows = 32});
  const double bytes = s.weight_bytes + kKvBytesPerToken * 32 * 4097 + kKvBytesPerToken * 32;
  EXPECT_DOUBLE_EQ(c.bytes, bytes);
  EXPECT_DOUBLE_EQ(c.memory_s, bytes / (4.8e12 * 0.7));
  EXPECT_GT(c.memory_s, c.compute_s);
  EXPECT_DOUBLE_EQ(c.seconds, c.memory_s + 200e-6);
  // About 10 ms: 15 GB of weights and 17 GB of KV at 3.4 TB/s.
  EXPECT_NEAR(c.seconds, 0.0098, 0.0005);
}

TEST(StepCostTest, LongPrefillIsBoundByComputeAndAttentionIsCausal) {
  const SimModel s = SimModelOf(Llama3_8B(), 2, kKvBytesPerToken);
  ASSERT_OK_AND_ASSIGN(GpuProfile h100, GpuPreset("h100"));
  const std::vector<int32_t> q = {8192}, ctx = {8192};
  const StepCost c = EstimateStep(s, h100, {.query_len = q, .context_len = ctx, .logit_rows = 1});
  const double attended = 8192.0 * 8193 / 2;
  const double flops =
      2.0 * s.matmul_params * 8192 + 2.0 * s.lm_head_params + 4.0 * s.attention_width * attended;
  EXPECT_DOUBLE_EQ(c.flops, flops);
  EXPECT_GT(c.compute_s, c.memory_s);
  EXPECT_DOUBLE_EQ(c.seconds, flops / (989e12 * 0.5) + 200e-6);
  // The same tokens as a second chunk of 4096 after 4096 cached: the first half's attention
  // is already done, so the chunk costs less than half the whole.
  const std::vector<int32_t> q2 = {4096}, ctx2 = {8192};
  const StepCost half = EstimateStep(s, h100, {.query_len = q2, .context_len = ctx2});
  const double attended2 = 4096.0 * 4096 + 4096.0 * 4097 / 2;
  EXPECT_DOUBLE_EQ(half.flops, 2.0 * s.matmul_params * 4096 + 4.0 * s.attention_width * attended2);
  // Swap traffic goes over PCIe on top.
  const StepCost copying =
      EstimateStep(s, h100, {.query_len = q2, .context_len = ctx2, .copy_bytes = 50'000'000'000});
  EXPECT_DOUBLE_EQ(copying.seconds - half.seconds, 1.0);
}

TEST(StepCostTest, UnknownPresetsAreRefusedByName) {
  EXPECT_THAT(GpuPreset("b200"), kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                                            ::testing::HasSubstr("'b200'")));
}

TEST(SimDeviceTest, AnEngineReportsTheFormulasTimeForEveryStep) {
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.backend.device = Device::kSim;
  ASSERT_OK_AND_ASSIGN(config.backend.sim_gpu, GpuPreset("a100"));
  config.backend.sim_sleep = false;
  config.scheduler.max_num_batched_tokens = 64;  // a 100-token prompt prefills in two chunks
  auto engine = testing::MakeEngine(config);
  ASSERT_NE(engine, nullptr);
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = 5 + i;
  ASSERT_OK(engine->AddRequest({.request_id = "r", .prompt = prompt, .max_tokens = 5}));
  testing::RunToCompletion(*engine);

  // The same steps by hand: chunks of 64 and 36 prompt tokens (the second draws the first
  // token), then four decode steps.
  const ModelConfig& m = engine->model_config();
  const double kv = engine->kv_spec().BytesPerToken(m.num_kv_heads, config.cache.block_size,
                                                    m.head_dim) /
                    2;  // auto: 16-bit on a GPU
  const SimModel s = SimModelOf(m, 2, kv);
  double want = 0;
  auto step = [&](int32_t q, int32_t ctx, int64_t rows) {
    const std::vector<int32_t> qv = {q}, cv = {ctx};
    want += EstimateStep(s, config.backend.sim_gpu,
                         {.query_len = qv, .context_len = cv, .logit_rows = rows})
                .seconds;
  };
  step(64, 64, 0);
  step(36, 100, 1);
  for (int k = 1; k <= 4; ++k) step(1, 100 + k, 1);
  EXPECT_DOUBLE_EQ(engine->stats().sim_busy_seconds, want);
}

}  // namespace
}  // namespace kvserve::worker
