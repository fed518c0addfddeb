// The engine never touches backend ("device") memory from the host: run on GuardedCpuBackend,
// whose allocations fault outside the backend's own ops, it must give exactly the plain CPU
// backend's results — prompt logits, greedy tokens, seeded samples with logprobs, prefix
// caching, chunked prefill and swap preemption through the host tier. A direct read or write of
// a device buffer (say, of the sampled tokens or the block tables) passes on the CPU backend
// and faults on a GPU; here it faults in CI.
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "tests/worker/guarded_backend.h"

namespace kvserve::worker {
namespace {

using testing::Results;

std::unique_ptr<kernels::Backend> Guarded() {
  return std::make_unique<testing::GuardedCpuBackend>();
}

void ExpectSameResults(Results& got, Results& want) {
  ASSERT_EQ(got.size(), want.size());
  for (auto& [id, samples] : want) {
    ASSERT_EQ(got[id].size(), samples.size()) << id;
    for (auto& [index, s] : samples) {
      const auto& g = got[id][index];
      EXPECT_EQ(g.tokens, s.tokens) << id << " sample " << index;
      EXPECT_EQ(g.prompt_logits, s.prompt_logits) << id;
      ASSERT_EQ(g.logprobs.size(), s.logprobs.size()) << id;
      for (size_t k = 0; k < s.logprobs.size(); ++k) {
        EXPECT_EQ(g.logprobs[k].logprob, s.logprobs[k].logprob) << id << " token " << k;
      }
    }
  }
}

TEST(EngineDeviceMemoryTest, ReferenceRunsMatchThePlainCpuBackend) {
  for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
    SCOPED_TRACE(model);
    const testing::Reference ref = testing::LoadReference(model);
    EngineConfig config = testing::FixtureConfig(model);
    config.scheduler.max_num_batched_tokens = 7;  // chunked prefill
    Results want = testing::RunReference(config, ref);
    Results got = testing::RunReference(config, ref, {.make_backend = Guarded});
    ExpectSameResults(got, want);
  }
}

TEST(EngineDeviceMemoryTest, SamplingPrefixCachingAndSwapMatchThePlainCpuBackend) {
  std::mt19937 rng(5);
  std::vector<int32_t> shared(24);
  for (int32_t& t : shared) t = static_cast<int32_t>(rng() % 1024);
  std::vector<RequestInput> requests;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = shared;  // a shared prefix, then each its own tokens
    for (int k = 0; k < 16; ++k) prompt.push_back(static_cast<int32_t>(rng() % 1024));
    RequestInput in = testing::GreedyRequest("r" + std::to_string(i), prompt, 20);
    if (i % 2 == 1) {
      in.sampling.temperature = 0.8f;
      in.sampling.top_k = 40;
      in.sampling.top_p = 0.9f;
      in.sampling.seed = 100 + i;
      in.sampling.n = 2;
      in.sampling.logprobs = 3;
    }
    requests.push_back(in);
  }
  EngineConfig config = testing::FixtureConfig("tiny-llama3", 24);  // the workload needs ~48
  config.cache.block_size = 8;
  config.max_model_len = 96;
  config.cache.num_host_blocks = 64;
  config.scheduler.preemption_mode = PreemptionMode::kSwap;
  auto run = [&](const RunnerTestHooks& hooks, int64_t* swapped) {
    auto engine = testing::MakeEngine(config, hooks);
    for (const RequestInput& in : requests) EXPECT_OK(engine->AddRequest(in));
    Results r = testing::RunToCompletion(*engine, true);
    *swapped = engine->stats().swap_out_blocks;
    return r;
  };
  int64_t swapped_plain = 0, swapped_guarded = 0;
  Results want = run({}, &swapped_plain);
  Results got = run({.make_backend = Guarded}, &swapped_guarded);
  EXPECT_GT(swapped_plain, 0) << "the pool was meant to be too small";
  EXPECT_EQ(swapped_guarded, swapped_plain);
  ExpectSameResults(got, want);
}

// Serving allocates no device memory after start-up, so that a GPU sized at start-up cannot
// run out mid-serving (vLLM #5907: prompt logprobs end the engine that way). The model reserves
// max_num_seqs rows of logits; prompt logits for longer prompts are computed in chunks of rows
// that fit (the scheduler's max_logit_rows), and still match transformers.
TEST(EngineDeviceMemoryTest, PromptLogitsLongerThanTheReservedRowsAllocateNothing) {
  const testing::Reference ref = testing::LoadReference("tiny-llama3");
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.scheduler.max_num_seqs = 4;  // 4 rows of logits a step
  testing::GuardedCpuBackend* backend = nullptr;
  RunnerTestHooks hooks;
  hooks.make_backend = [&]() -> std::unique_ptr<kernels::Backend> {
    auto b = std::make_unique<testing::GuardedCpuBackend>();
    backend = b.get();
    return b;
  };
  auto engine = testing::MakeEngine(config, hooks);
  ASSERT_NE(engine, nullptr);
  const size_t at_start = backend->allocated();
  size_t longest = 0;
  for (const auto& p : ref.prompts) longest = std::max(longest, p.size());
  ASSERT_GT(longest, 4 * 4u) << "prompts that need several steps of rows";
  testing::AddReferenceRequests(*engine, ref);
  Results got = testing::RunToCompletion(*engine, true);
  EXPECT_EQ(backend->allocated(), at_start) << "device memory allocated while serving";
  testing::ExpectMatchesReference(got, ref);
}

}  // namespace
}  // namespace kvserve::worker
