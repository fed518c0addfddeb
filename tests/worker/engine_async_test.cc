// Async scheduling (worker/engine_step.cc) changes when the host learns a step's tokens, never
// which tokens: every fixture's mixed workload gives the same samples, logprobs, finish reasons
// and prompt scores with steps run ahead as without, and steps did run ahead. The features that
// need the previous token on the host (penalties, bad words, forks of n samples) fall back to
// steps in series for the sequences that have them, and a request that ends mid-flight drops
// the row already queued for it. On the CPU backend, which gains nothing from it (its steps
// finish before they return), but runs the same engine code as a GPU.
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

// A mix over every path of the step: greedy with logprobs, seeded temperature draws, stop ids
// and EOS that end a sequence mid-flight, max_tokens, min_tokens, logit_bias, a penalty and bad
// words (steps in series), n = 3 (a fork), prompt logprobs and prompt logits (rows that come
// back), a long prompt in chunks next to decodes.
void AddWorkload(Engine& engine, int vocab, int eos) {
  std::mt19937 rng(61);
  auto prompt = [&](int len) {
    std::vector<int32_t> p(len);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % vocab);
    return p;
  };
  for (int i = 0; i < 6; ++i) {
    RequestInput in =
        testing::GreedyRequest("greedy" + std::to_string(i), prompt(5 + 7 * i), 8 + 3 * i);
    if (i % 2 == 1) in.sampling.ignore_eos = false;
    ASSERT_OK(engine.AddRequest(std::move(in)));
  }
  for (int i = 0; i < 4; ++i) {
    RequestInput in;
    in.request_id = "sampled" + std::to_string(i);
    in.prompt = prompt(12 + i);
    in.max_tokens = 20;
    in.sampling.temperature = 0.9f;
    in.sampling.top_p = 0.95f;
    in.sampling.seed = 100 + i;
    in.sampling.logprobs = 3;
    ASSERT_OK(engine.AddRequest(std::move(in)));
  }
  RequestInput stop = testing::GreedyRequest("stop-ids", prompt(9), 30);
  for (int t = 0; t < vocab; t += 7) stop.stop_token_ids.push_back(t);  // ends early
  stop.sampling.ignore_eos = false;
  ASSERT_OK(engine.AddRequest(std::move(stop)));
  RequestInput min = testing::GreedyRequest("min-tokens", prompt(6), 12);
  min.sampling.ignore_eos = false;
  min.sampling.min_tokens = 5;
  min.sampling.logit_bias = {{eos, 20.0f}};  // EOS the moment it is allowed
  ASSERT_OK(engine.AddRequest(std::move(min)));
  RequestInput penalized = testing::GreedyRequest("penalized", prompt(10), 16);
  penalized.sampling.presence_penalty = 1.5f;
  penalized.sampling.repetition_penalty = 1.3f;
  ASSERT_OK(engine.AddRequest(std::move(penalized)));
  RequestInput bad = testing::GreedyRequest("bad-words", prompt(8), 10);
  bad.sampling.bad_words = {{3, 4}, {9}};
  ASSERT_OK(engine.AddRequest(std::move(bad)));
  RequestInput forked;
  forked.request_id = "n3";
  forked.prompt = prompt(11);
  forked.max_tokens = 9;
  forked.sampling.n = 3;
  forked.sampling.temperature = 1.0f;
  forked.sampling.seed = 7;
  ASSERT_OK(engine.AddRequest(std::move(forked)));
  RequestInput scored = testing::GreedyRequest("prompt-scores", prompt(14), 6);
  scored.sampling.prompt_logprobs = 2;
  scored.return_prompt_logits = true;
  ASSERT_OK(engine.AddRequest(std::move(scored)));
  ASSERT_OK(engine.AddRequest(testing::GreedyRequest("long", prompt(150), 12)));
}

testing::Results RunWorkload(const std::string& fixture, AsyncScheduling async,
                             EngineStats* stats) {
  EngineConfig config = testing::FixtureConfig(fixture);
  config.scheduler.max_num_batched_tokens = 64;  // the long prompt in chunks
  config.async_scheduling = async;
  auto engine = testing::MakeEngine(config);
  if (engine == nullptr) return {};
  const int eos =
      engine->model_config().eos_token_ids.empty() ? 0 : engine->model_config().eos_token_ids[0];
  AddWorkload(*engine, engine->model_config().vocab_size, eos);
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  *stats = engine->stats();
  EXPECT_EQ(stats->blocks_free, stats->blocks_total);  // nothing held (cached ones count free)
  return r;
}

class EngineAsyncTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineAsyncTest, StepsRunAheadAndDrawTheSameTokens) {
  EngineStats serial_stats, async_stats;
  testing::Results serial = RunWorkload(GetParam(), AsyncScheduling::kOff, &serial_stats);
  testing::Results ahead = RunWorkload(GetParam(), AsyncScheduling::kOn, &async_stats);
  ASSERT_EQ(serial.size(), 17u);
  ASSERT_EQ(ahead.size(), serial.size());
  testing::ExpectSameSamples(ahead, serial, /*tolerance=*/0);
  for (auto& [id, samples] : serial) {
    for (auto& [i, want] : samples) {
      const testing::SampleResult& got = ahead[id][i];
      SCOPED_TRACE(id + " sample " + std::to_string(i));
      EXPECT_EQ(got.finish, want.finish);
      EXPECT_EQ(got.prompt_logits, want.prompt_logits);
      ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size());
      for (size_t k = 0; k < want.prompt_logprobs.size(); ++k) {
        EXPECT_EQ(got.prompt_logprobs[k].logprob, want.prompt_logprobs[k].logprob);
      }
    }
  }
  EXPECT_EQ(serial_stats.steps_ahead, 0);
  // A step with a penalized, bad-words or forking sequence runs in series: here, while those
  // run, most of them.
  EXPECT_GE(async_stats.steps_ahead, 5) << "too few steps ran ahead: the test proves little";
  EXPECT_EQ(async_stats.generated_tokens - serial_stats.generated_tokens, 0);
  std::printf("%s: %lld of %lld steps ran ahead\n", GetParam().c_str(),
              static_cast<long long>(async_stats.steps_ahead),
              static_cast<long long>(async_stats.steps));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineAsyncTest,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-qwen3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

// Without a sequence that needs its last token on the host, every step runs ahead, prompts'
// steps included, and the last one is applied by a step that plans nothing.
TEST(EngineAsyncAbortTest, PlainStepsAllRunAhead) {
  EngineConfig config = testing::FixtureConfig("tiny-qwen3");
  config.async_scheduling = AsyncScheduling::kOn;
  auto engine = testing::MakeEngine(config);
  ASSERT_NE(engine, nullptr);
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(engine->AddRequest(
        testing::GreedyRequest("r" + std::to_string(i), std::vector<int32_t>(3 + i, 5 + i), 10)));
  }
  testing::Results r = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  ASSERT_EQ(r.size(), 4u);
  for (auto& [id, samples] : r) EXPECT_EQ(samples[0].tokens.size(), 10u) << id;
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.steps_ahead, s.steps);
  EXPECT_EQ(s.steps, 10);  // the prompts' step draws each first token
}

// Aborts while a step is in flight: the request's queued row is dropped, it says nothing more,
// and what the settled step drew for the others comes with the next step.
TEST(EngineAsyncAbortTest, AnAbortSettlesTheStepInFlight) {
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.async_scheduling = AsyncScheduling::kOn;
  auto engine = testing::MakeEngine(config);
  ASSERT_NE(engine, nullptr);
  ASSERT_OK(engine->AddRequest(testing::GreedyRequest("a", {1, 2, 3, 4, 5}, 10)));
  ASSERT_OK(engine->AddRequest(testing::GreedyRequest("b", {6, 7, 8, 9}, 10)));
  ASSERT_OK_AND_ASSIGN(std::vector<SequenceOutput> first, engine->Step());
  EXPECT_TRUE(first.empty()) << "the prompts' step is still in flight";
  ASSERT_OK(engine->Abort("a"));
  ASSERT_OK(engine->TEST_CheckInvariants());
  ASSERT_OK_AND_ASSIGN(std::vector<SequenceOutput> second, engine->Step());
  ASSERT_EQ(second.size(), 1u);  // b's first token, from the settled step
  EXPECT_EQ(second[0].request_id, "b");
  testing::Results rest = testing::RunToCompletion(*engine, /*check_invariants=*/true);
  EXPECT_FALSE(rest.contains("a"));
  EXPECT_EQ(rest["b"][0].tokens.size(), 9u);
  EXPECT_TRUE(engine->Abort("a").code() == absl::StatusCode::kNotFound);
}

// Async scheduling runs with one tensor-parallel rank; asked for with more, it is refused by
// name.
TEST(EngineAsyncAbortTest, MoreRanksAreRefusedByName) {
  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.async_scheduling = AsyncScheduling::kOn;
  config.parallel.tensor_parallel_size = 2;
  EXPECT_THAT(config.Validate().message(), ::testing::HasSubstr("async scheduling"));
}

}  // namespace
}  // namespace kvserve::worker
