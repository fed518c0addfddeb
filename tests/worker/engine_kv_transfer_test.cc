// Engine::ExportPrefix / ImportPrefix (worker/prefix_transfer.h): a prompt's KV computed by
// one engine, moved as bytes into another's prefix cache, serves the second engine's request
// (its prefill skips those blocks) with the same greedy tokens and logprobs as the first, for
// every KV format; blocks of another prompt, salt or format, and a pool with no room, are
// refused with nothing changed.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker::testing {
namespace {

using kvserve::testing::StatusIs;
using ::testing::HasSubstr;

// Three reference prompts end to end: several blocks, and not a whole number of them.
std::vector<int32_t> LongPrompt(int block_size) {
  const Reference ref = LoadReference("tiny-llama3");
  std::vector<int32_t> p;
  for (const auto& q : ref.prompts) p.insert(p.end(), q.begin(), q.end());
  while (p.size() % block_size == 0 || p.size() < 3u * block_size) p.push_back(p[p.size() / 2]);
  return p;
}

EngineConfig Config(const KvQuantOptions& q, int num_blocks = 512) {
  EngineConfig c = FixtureConfig("tiny-llama3", num_blocks);
  c.cache.kv_quant = q;
  return c;
}

class EngineKvTransferTest : public ::testing::TestWithParam<KvQuantOptions> {};

TEST_P(EngineKvTransferTest, APeersBlocksServeTheRequestAsItsOwnPrefillWould) {
  std::unique_ptr<Engine> a = MakeEngine(Config(GetParam()));
  std::unique_ptr<Engine> b = MakeEngine(Config(GetParam()));
  ASSERT_TRUE(a && b);
  const int bs = a->config().cache.block_size;
  const std::vector<int32_t> prompt = LongPrompt(bs);
  ASSERT_OK(a->AddRequest(GreedyRequest("r", prompt, 12)));
  Results want = RunToCompletion(*a);

  ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk exported, a->ExportPrefix(prompt, ""));
  const std::vector<std::string>& wires = exported.wires;
  ASSERT_EQ(wires.size(), 1u);
  const int full = static_cast<int>(prompt.size()) / bs;
  ASSERT_OK_AND_ASSIGN(int added, b->ImportPrefix(prompt, "", wires));
  EXPECT_EQ(added, full);
  ASSERT_OK_AND_ASSIGN(int again, b->ImportPrefix(prompt, "", wires));
  EXPECT_EQ(again, 0) << "blocks already cached are skipped";

  ASSERT_OK(b->AddRequest(GreedyRequest("r", prompt, 12)));
  Results got = RunToCompletion(*b, /*check_invariants=*/true);
  EXPECT_EQ(got["r"][0].num_cached_prompt_tokens, full * bs) << "prefill skipped the peer's blocks";
  EXPECT_EQ(got["r"][0].tokens, want["r"][0].tokens);
  ExpectSameSamples(got, want, 1e-4);
  EXPECT_EQ(b->stats().computed_tokens, a->stats().computed_tokens - full * bs);
}

TEST_P(EngineKvTransferTest, ChunksOfTwoBlocksArriveOneByOneAndEachContinuesTheChain) {
  std::unique_ptr<Engine> a = MakeEngine(Config(GetParam()));
  std::unique_ptr<Engine> b = MakeEngine(Config(GetParam()));
  ASSERT_TRUE(a && b);
  const int bs = a->config().cache.block_size;
  const std::vector<int32_t> prompt = LongPrompt(bs);
  const int full = static_cast<int>(prompt.size()) / bs;
  ASSERT_OK(a->AddRequest(GreedyRequest("r", prompt, 6)));
  Results want = RunToCompletion(*a);

  // A chunk whose parent block is not cached at the target is refused.
  ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk second, a->ExportPrefix(prompt, "", 2, 2));
  EXPECT_THAT(b->ImportPrefix(prompt, "", second.wires, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("block 1, the parent")));
  int first = 0, added = 0;
  for (bool more = true; more;) {
    ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk c, a->ExportPrefix(prompt, "", first, 2));
    EXPECT_EQ(c.first_block, first);
    EXPECT_EQ(c.num_blocks, std::min(2, full - first));
    ASSERT_OK_AND_ASSIGN(int n, b->ImportPrefix(prompt, "", c.wires, first));
    added += n;
    first += c.num_blocks;
    more = c.more;
  }
  EXPECT_EQ(added, full);
  // A chunk placed at another block than its own is refused by hash.
  EXPECT_THAT(b->ImportPrefix(prompt, "", second.wires, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("block 1 is not the prompt's block 1")));
  ASSERT_OK(b->AddRequest(GreedyRequest("r", prompt, 6)));
  Results got = RunToCompletion(*b, /*check_invariants=*/true);
  EXPECT_EQ(got["r"][0].num_cached_prompt_tokens, full * bs);
  ExpectSameSamples(got, want, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    EveryFormat, EngineKvTransferTest,
    ::testing::Values(KvQuantOptions{.dtype = "auto"}, KvQuantOptions{.dtype = "bf16"},
                      KvQuantOptions{.dtype = "fp8_e4m3", .granularity = "per_token"},
                      KvQuantOptions{.dtype = "int8", .granularity = "per_channel"},
                      KvQuantOptions{.dtype = "int4", .granularity = "per_group", .group_size = 8}),
    [](const auto& info) {
      return info.param.dtype == "fp8_e4m3" ? std::string("fp8") : info.param.dtype;
    });

TEST(EngineKvTransferTp, EachRankSendsItsOwnHeadsAndTheSizesMustMatch) {
  // Tensor parallelism 2 on both sides (the CPU backend's ranks): one wire per rank, each with
  // its half of the KV heads.
  EngineConfig tp2 = Config({.dtype = "int8", .granularity = "per_token"});
  tp2.parallel.tensor_parallel_size = 2;
  tp2.parallel.collective_timeout = absl::Seconds(30);
  std::unique_ptr<Engine> a = MakeEngine(tp2);
  std::unique_ptr<Engine> b = MakeEngine(tp2);
  ASSERT_TRUE(a && b);
  const int bs = a->config().cache.block_size;
  const std::vector<int32_t> prompt = LongPrompt(bs);
  ASSERT_OK(a->AddRequest(GreedyRequest("r", prompt, 8)));
  Results want = RunToCompletion(*a);
  ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk exported, a->ExportPrefix(prompt, ""));
  const std::vector<std::string>& wires = exported.wires;
  ASSERT_EQ(wires.size(), 2u);
  EXPECT_NE(wires[0], wires[1]) << "each rank its own heads";
  const int full = static_cast<int>(prompt.size()) / bs;
  ASSERT_OK_AND_ASSIGN(int added, b->ImportPrefix(prompt, "", wires));
  EXPECT_EQ(added, full);
  ASSERT_OK(b->AddRequest(GreedyRequest("r", prompt, 8)));
  Results got = RunToCompletion(*b, /*check_invariants=*/true);
  EXPECT_EQ(got["r"][0].num_cached_prompt_tokens, full * bs);
  EXPECT_EQ(got["r"][0].tokens, want["r"][0].tokens);
  ExpectSameSamples(got, want, 1e-4);
  // A TP-1 engine takes no TP-2 blocks: its hashes differ (the TP size is in the extra key), and
  // two wires are not its one.
  std::unique_ptr<Engine> tp1 = MakeEngine(Config({.dtype = "int8", .granularity = "per_token"}));
  EXPECT_THAT(tp1->ImportPrefix(prompt, "", wires),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("2 wires for 1")));
  EXPECT_THAT(tp1->ImportPrefix(prompt, "", {wires[0]}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KV heads (per rank)")));
}

TEST(EngineKvTransferRefusals, BlocksOfAnotherPromptSaltOrFormatAndAFullPoolChangeNothing) {
  std::unique_ptr<Engine> a = MakeEngine(Config({.dtype = "int8", .granularity = "per_token"}));
  ASSERT_TRUE(a);
  const int bs = a->config().cache.block_size;
  const std::vector<int32_t> prompt = LongPrompt(bs);
  ASSERT_OK(a->AddRequest(GreedyRequest("r", prompt, 1)));
  RunToCompletion(*a);
  ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk exported, a->ExportPrefix(prompt, ""));
  const std::vector<std::string>& wires = exported.wires;

  std::unique_ptr<Engine> b = MakeEngine(Config({.dtype = "int8", .granularity = "per_token"}));
  std::vector<int32_t> other = prompt;
  other[0] = other[0] == 1 ? 2 : 1;
  EXPECT_THAT(b->ImportPrefix(other, "", wires),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("block 0 is not the prompt's block 0")));
  EXPECT_THAT(b->ImportPrefix(prompt, "tenant-b", wires),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("block 0 is not")));
  EXPECT_THAT(b->ImportPrefix(prompt, "", {wires[0], wires[0]}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("2 wires for 1")));
  std::unique_ptr<Engine> int4 = MakeEngine(Config({.dtype = "int4", .granularity = "per_token"}));
  EXPECT_THAT(int4->ImportPrefix(prompt, "", wires),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KV formats")));
  // Two blocks in all, one held by a running request: no room for the prompt's.
  EngineConfig two_blocks = Config({.dtype = "int8", .granularity = "per_token"}, 2);
  two_blocks.max_model_len = 2 * bs;
  std::unique_ptr<Engine> small = MakeEngine(two_blocks);
  ASSERT_TRUE(small);
  ASSERT_OK(small->AddRequest(GreedyRequest("hold", {1, 2, 3}, 20)));
  ASSERT_OK(small->Step().status());
  EXPECT_THAT(small->ImportPrefix(prompt, "", wires),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("no room")));
  // Nothing was cached by the refusals: the prompt is computed whole.
  ASSERT_OK(b->AddRequest(GreedyRequest("r", prompt, 1)));
  EXPECT_EQ(RunToCompletion(*b)["r"][0].num_cached_prompt_tokens, 0);
  // And a prompt never computed exports no block.
  ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk none, b->ExportPrefix(other, ""));
  EXPECT_EQ(none.num_blocks, 0);
  ASSERT_OK_AND_ASSIGN(int added, a->ImportPrefix(other, "", none.wires));
  EXPECT_EQ(added, 0);
}

}  // namespace
}  // namespace kvserve::worker::testing
