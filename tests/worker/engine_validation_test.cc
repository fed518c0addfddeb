// Bad requests are rejected with InvalidArgument and leave the engine as it was; impossible
// settings are refused at start-up naming the setting and its limit.
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

using kvserve::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(EngineValidationTest, BadRequestsAreRejectedAndChangeNothing) {
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.max_model_len = 64;
  auto engine = testing::MakeEngine(config);
  ASSERT_OK(engine->AddRequest(testing::GreedyRequest("ok", {1, 2, 3}, 4)));
  const EngineStats before = engine->stats();

  struct Case {
    std::function<void(RequestInput&)> edit;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<Case> cases = {
      {[](RequestInput& r) { r.prompt.clear(); }, absl::StatusCode::kInvalidArgument,
       "prompt must not be empty"},
      {[](RequestInput& r) {
         r.prompt = {5, 1024};
       },
       absl::StatusCode::kInvalidArgument,
       "prompt token 1 is 1024, outside the vocabulary [0, 1024)"},
      {[](RequestInput& r) { r.prompt = {-1}; }, absl::StatusCode::kInvalidArgument, "is -1"},
      {[](RequestInput& r) { r.max_tokens = 0; }, absl::StatusCode::kInvalidArgument,
       "max_tokens must be >= 1, got 0"},
      {[](RequestInput& r) { r.max_tokens = -5; }, absl::StatusCode::kInvalidArgument, "got -5"},
      {[](RequestInput& r) {
         r.prompt.assign(60, 7);
         r.max_tokens = 5;
       },
       absl::StatusCode::kInvalidArgument,
       "prompt (60 tokens) + max_tokens (5) exceeds the maximum model length (64)"},
      {[](RequestInput& r) { r.sampling.temperature = -1; }, absl::StatusCode::kInvalidArgument,
       "temperature"},
      {[](RequestInput& r) { r.sampling.top_p = 0; }, absl::StatusCode::kInvalidArgument, "top_p"},
      {[](RequestInput& r) { r.sampling.min_p = 2; }, absl::StatusCode::kInvalidArgument, "min_p"},
      {[](RequestInput& r) { r.sampling.n = 0; }, absl::StatusCode::kInvalidArgument,
       "n must be in"},
      {[](RequestInput& r) { r.sampling.logprobs = 1025; }, absl::StatusCode::kInvalidArgument,
       "logprobs"},
      {[](RequestInput& r) { r.stop_token_ids = {4096}; }, absl::StatusCode::kInvalidArgument,
       "stop_token_ids: token id 4096 is outside the vocabulary [0, 1024)"},
      {[](RequestInput& r) { r.request_id = ""; }, absl::StatusCode::kInvalidArgument,
       "request_id"},
      {[](RequestInput& r) { r.priority = 3; }, absl::StatusCode::kInvalidArgument,
       "priority 3 needs --scheduling-policy priority"},
      {[](RequestInput& r) { r.sampling.presence_penalty = 2.5f; },
       absl::StatusCode::kInvalidArgument, "presence_penalty must be in [-2, 2], got 2.5"},
      {[](RequestInput& r) { r.sampling.frequency_penalty = -3; },
       absl::StatusCode::kInvalidArgument, "frequency_penalty must be in [-2, 2]"},
      {[](RequestInput& r) { r.sampling.repetition_penalty = 0; },
       absl::StatusCode::kInvalidArgument, "repetition_penalty must be > 0"},
      {[](RequestInput& r) { r.sampling.min_tokens = 5; }, absl::StatusCode::kInvalidArgument,
       "min_tokens must be in [0, max_tokens=4], got 5"},
      {[](RequestInput& r) {
         r.sampling.logit_bias = {{1024, 1.0f}};
       },
       absl::StatusCode::kInvalidArgument, "logit_bias: token id 1024 is outside the vocabulary"},
      {[](RequestInput& r) {
         r.sampling.logit_bias = {{3, 101.0f}};
       },
       absl::StatusCode::kInvalidArgument, "logit_bias of token 3 must be in [-100, 100]"},
      {[](RequestInput& r) { r.sampling.bad_words = {{}}; }, absl::StatusCode::kInvalidArgument,
       "bad_words: a word has no tokens"},
      {[](RequestInput& r) {
         r.sampling.bad_words = {{3, -2}};
       },
       absl::StatusCode::kInvalidArgument, "bad_words: token id -2"},
      {[](RequestInput& r) { r.sampling.allowed_token_ids = {5000}; },
       absl::StatusCode::kInvalidArgument, "allowed_token_ids: token id 5000"},
      {[](RequestInput& r) { r.request_id = "ok"; }, absl::StatusCode::kAlreadyExists, "'ok'"},
  };
  for (const Case& c : cases) {
    RequestInput in = testing::GreedyRequest("bad", {1, 2, 3}, 4);
    c.edit(in);
    EXPECT_THAT(engine->AddRequest(in), StatusIs(c.code, HasSubstr(c.message)));
  }
  const EngineStats after = engine->stats();
  EXPECT_EQ(after.num_requests, before.num_requests);
  EXPECT_EQ(after.num_waiting, before.num_waiting);
  EXPECT_EQ(after.blocks_free, before.blocks_free);
  EXPECT_THAT(engine->Abort("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));
  testing::Results r = testing::RunToCompletion(*engine, true);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_EQ(r["ok"][0].tokens.size(), 4u);
}

TEST(EngineValidationTest, AbortAtAnyPointFreesEverything) {
  for (int steps_before_abort = 0; steps_before_abort < 6; ++steps_before_abort) {
    EngineConfig config = testing::FixtureConfig("tiny-qwen2", 64);
    config.scheduler.max_num_batched_tokens = 16;  // the prompt takes several steps
    auto engine = testing::MakeEngine(config);
    RequestInput in = testing::GreedyRequest("r", std::vector<int32_t>(50, 9), 10);
    in.sampling.n = 3;
    in.sampling.temperature = 1.0f;
    ASSERT_OK(engine->AddRequest(in));
    for (int i = 0; i < steps_before_abort; ++i) ASSERT_OK(engine->Step().status());
    ASSERT_OK(engine->Abort("r"));
    EXPECT_FALSE(engine->HasWork());
    const EngineStats s = engine->stats();
    EXPECT_EQ(s.blocks_free, s.blocks_total) << "after " << steps_before_abort << " steps";
    ASSERT_OK(engine->TEST_CheckInvariants());
  }
}

TEST(EngineValidationTest, ImpossibleSettingsAreRefusedAtStartup) {
  EngineConfig c = testing::FixtureConfig("tiny-llama3", /*num_blocks=*/10);
  c.max_model_len = 1024;
  EXPECT_THAT(Engine::Create(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("--max-model-len (1024)"),
                                                HasSubstr("160 tokens in 10 blocks"))));
  c = testing::FixtureConfig("tiny-llama3");
  c.max_model_len = 5000;
  EXPECT_THAT(Engine::Create(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("max_position_embeddings (4096)")));
  c = testing::FixtureConfig("tiny-llama3");
  c.cache.block_size = 12;
  EXPECT_THAT(Engine::Create(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("--block-size must be 8, 16 or 32, got 12")));
  c = testing::FixtureConfig("tiny-llama3");
  c.cache.num_blocks = 0;
  c.cache.kv_cache_memory_gib = 1e-9;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--kv-cache-memory-gib")));
  c = testing::FixtureConfig("tiny-llama3");
  c.scheduler.max_num_seqs = 0;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-num-seqs")));
  // The flags' spellings (EngineConfigFromFlags parses them so).
  EXPECT_THAT(ParseWeightDtype("int8"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--dtype 'int8' is not one of auto, float32, bfloat16, float16")));
  EXPECT_THAT(ParseAttentionKernel("flash"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--attention-kernel 'flash' is not one of simt, tensor-cores, "
                                 "pipelined")));
  EXPECT_THAT(ParseDevice("tpu"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--device 'tpu' is not one of cpu, cuda, null")));
  c = testing::FixtureConfig("tiny-llama3");
  // The CPU backend has one attention kernel.
  c.backend.attention_kernel = AttentionKernel::kTensorCores;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--attention-kernel tensor-cores needs --device cuda")));
  c.backend.attention_kernel = AttentionKernel::kPipelined;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--attention-kernel pipelined needs --device cuda")));
  c = testing::FixtureConfig("tiny-llama3");
  c.backend.cuda_graph_max_batch = -1;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--cuda-graph-max-batch must be >= 0, got -1")));
  c.backend.cuda_graph_max_batch = 8;  // the CPU backend records no graphs
  EXPECT_THAT(Engine::Create(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("--cuda-graph-max-batch needs --device cuda")));
  c = testing::FixtureConfig("tiny-llama3");
  c.backend.decode_gemv_max_batch = 9;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--decode-gemv-max-batch must be at most 8, got 9")));
  c.backend.decode_gemv_max_batch = 4;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--decode-gemv-max-batch needs --device cuda")));
  c.backend.device = Device::kCuda;  // refused before any device is touched
  c.dtype = WeightDtype::kFloat32;
  EXPECT_THAT(Engine::Create(c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--decode-gemv-max-batch needs 16-bit weights")));
  c = testing::FixtureConfig("tiny-llama3");
  c.cache.swap_space_gib = 1e6;
  EXPECT_THAT(Engine::Create(c), StatusIs(absl::StatusCode::kInvalidArgument,
                                          AllOf(HasSubstr("--swap-space: a host tier of"),
                                                HasSubstr("than 70% of this machine's"))));
  c = testing::FixtureConfig("tiny-llama3");
  c.model_dir = "/nonexistent";
  EXPECT_THAT(Engine::Create(c), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent")));
}

TEST(EngineValidationTest, PreflightReportsTheBudget) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3", 100));
  const std::string& r = engine->preflight_report();
  EXPECT_THAT(r, HasSubstr("KV bytes per token  768.00 per rank (12288 per block of 16 tokens"));
  EXPECT_THAT(r, HasSubstr("K fp32, V fp32"));
  EXPECT_THAT(r, HasSubstr("100 blocks x 16 tokens = 1600 tokens"));
  EXPECT_THAT(r, HasSubstr("1 sequences at --max-model-len=1024 (64 blocks each)"));
}

// vLLM's --kv-cache-memory-bytes sizes the pool in bytes (12288 per block here); --num-blocks
// wins over it, and too few bytes for one block are refused naming the flag.
TEST(EngineValidationTest, KvCacheMemoryBytesSizesThePool) {
  EngineConfig c = testing::FixtureConfig("tiny-llama3", 0);
  c.cache.kv_cache_memory_bytes = 12288 * 70 + 100;
  EXPECT_EQ(testing::MakeEngine(c)->stats().blocks_total, 70);
  c.cache.num_blocks = 90;
  EXPECT_EQ(testing::MakeEngine(c)->stats().blocks_total, 90);
  c.cache.num_blocks = 0;
  c.cache.kv_cache_memory_bytes = 1000;
  EXPECT_THAT(Engine::Create(c).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--kv-cache-memory-bytes (1000) holds no block of 12288 bytes")));
}

// The weights' line names their type; bf16 matrices take half the bytes (norms stay float32).
TEST(EngineValidationTest, PreflightReportsTheWeightType) {
  auto weight_mib = [](const std::string& report) {
    const size_t at = report.find("weights");
    double mib = 0;
    EXPECT_NE(at, std::string::npos);
    if (at != std::string::npos) std::sscanf(report.c_str() + at, "weights %lf MiB", &mib);
    return mib;
  };
  EngineConfig c = testing::FixtureConfig("tiny-llama3", 100);
  auto f32 = testing::MakeEngine(c);
  c.dtype = WeightDtype::kBFloat16;
  auto bf16 = testing::MakeEngine(c);
  EXPECT_THAT(f32->preflight_report(), HasSubstr("per rank (float32)"));
  EXPECT_THAT(bf16->preflight_report(), HasSubstr("per rank (bfloat16)"));
  const double ratio = weight_mib(bf16->preflight_report()) / weight_mib(f32->preflight_report());
  EXPECT_GT(ratio, 0.49);
  EXPECT_LT(ratio, 0.51);
}

TEST(EngineStopTest, StopTokensEosAndLength) {
  auto engine = testing::MakeEngine(testing::FixtureConfig("tiny-llama3"));
  // Greedy continuation of reference prompt 0 starts 722, 200, 225.
  RequestInput stop = testing::GreedyRequest("stop", {1, 2, 3}, 30);
  auto probe = testing::GreedyRequest("probe", {1, 2, 3}, 5);
  ASSERT_OK(engine->AddRequest(probe));
  auto r = testing::RunToCompletion(*engine);
  const std::vector<int32_t> path = r["probe"][0].tokens;
  EXPECT_EQ(r["probe"][0].finish, FinishReason::kLength);
  stop.stop_token_ids = {path[2]};
  ASSERT_OK(engine->AddRequest(stop));
  r = testing::RunToCompletion(*engine);
  EXPECT_EQ(r["stop"][0].tokens, std::vector<int32_t>(path.begin(), path.begin() + 3));
  EXPECT_EQ(r["stop"][0].finish, FinishReason::kStop);
}

}  // namespace
}  // namespace kvserve::worker
