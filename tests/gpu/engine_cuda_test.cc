// The engine on the CUDA backend (--device cuda) against transformers' reference logits and
// greedy continuations for every fixture (float32 weights and KV cache: relative error
// < 1e-4), with and without chunked prefill; and an int8 KV cache on the GPU against the same
// cache on the CPU. Skipped without a CUDA device. Label: gpu.
#include "gtest/gtest.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

using testing::ExpectMatchesReference;
using testing::FixtureConfig;
using testing::LoadReference;
using testing::Reference;
using testing::Results;
using testing::RunReference;

// Prompt logits of every reference prompt through an engine with `config`.
std::vector<std::vector<float>> PromptLogits(const EngineConfig& config, const Reference& ref) {
  Results results = RunReference(config, ref);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    out.push_back(results[std::to_string(i)][0].prompt_logits);
  }
  return out;
}

class EngineCudaTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(EngineCudaTest, LogitsAndGreedyMatchTransformers) {
  const auto& [model, chunk] = GetParam();
  const Reference ref = LoadReference(model);
  EngineConfig config = FixtureConfig(model);
  config.device = "cuda";
  if (chunk > 0) config.scheduler.max_num_batched_tokens = chunk;
  Results results = RunReference(config, ref);
  ExpectMatchesReference(results, ref);
}

INSTANTIATE_TEST_SUITE_P(AllFixtures, EngineCudaTest,
                         ::testing::Combine(::testing::Values("tiny-llama3", "tiny-qwen2",
                                                              "tiny-qwen3"),
                                            ::testing::Values(0, 7)));

TEST(EngineCudaQuantTest, Int8CacheOnTheGpuMatchesTheCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Reference ref = LoadReference("tiny-llama3");
  EngineConfig config = FixtureConfig("tiny-llama3");
  config.kv_quant.dtype = "int8";
  config.kv_quant.granularity = "k:per_channel,v:per_token";
  const auto cpu = PromptLogits(config, ref);
  config.device = "cuda";
  const auto gpu = PromptLogits(config, ref);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_LT(testing::RelativeError(gpu[i], cpu[i]), 1e-4) << "prompt " << i;
  }
}

}  // namespace
}  // namespace kvserve::worker
