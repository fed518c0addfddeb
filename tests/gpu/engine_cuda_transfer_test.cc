// KV transfer on the CUDA backend (docs/DISAGGREGATION.md): a prompt's blocks leave one CUDA
// engine's device pools and enter another's, through pinned staging as wire bytes, over NCCL
// links device to device, and streamed layer by layer while the prefill computes; the
// importer's greedy tokens and logprobs are the exporter's, for every KV format with one rank
// and two formats with two. Skipped without a CUDA device; the link cases run only in the
// KVSERVE_CUDA_EMULATED build (both engines on the same GPUs of one process, which NCCL
// refuses). Label: gpu. CI runs it in the emulated build (tests/testing/cuda_emulator).
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#define XXH_INLINE_ALL  // header-only: the test forges a header checksum
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/nccl_communicator.h"  // CudaDeviceCount
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"
#include "worker/kv_link_maker.h"

namespace kvserve::worker {
namespace {

using testing::FixtureConfig;
using testing::LoadReference;
using testing::Results;

// The KV transfer tests' cases: two caches (emulation is slow), the GPU's own bf16 and a
// quantized one with scales; a CUDA engine's config for each; and the fixture's prompts as one
// prompt that ends in a partial block.
const std::vector<KvQuantOptions> kTransferCaches = {
    {.dtype = "bf16"}, {.dtype = "int4", .granularity = "per_channel"}};
// And every other KV format, for the one-rank cases: the engine's auto dtype, fp8,
// int8 per token, and K per channel with V per token.
const std::vector<KvQuantOptions> kEveryTransferCache = {
    {.dtype = "bf16"}, {.dtype = "int4", .granularity = "per_channel"},
    {.dtype = "auto"}, {.dtype = "fp8_e4m3"},
    {.dtype = "int8"}, {.dtype = "int8", .granularity = "k:per_channel,v:per_token"}};

EngineConfig TransferConfig(const KvQuantOptions& q, int tp = 1) {
  EngineConfig config = FixtureConfig("tiny-llama3");
  config.backend.device = Device::kCuda;
  config.cache.kv_quant = q;
  config.parallel.tensor_parallel_size = tp;
  config.parallel.collective_timeout = absl::Seconds(60);
  return config;
}

std::vector<int32_t> TransferPrompt(int block_size) {
  std::vector<int32_t> prompt;
  for (const auto& p : LoadReference("tiny-llama3").prompts) {
    prompt.insert(prompt.end(), p.begin(), p.end());
  }
  if (prompt.size() % block_size == 0) prompt.push_back(prompt[0]);
  return prompt;
}

// KV transfer (docs/DISAGGREGATION.md) on the CUDA backend: a prompt's blocks leave one CUDA
// engine's device pools as wire bytes (through pinned staging) and enter another's; the
// importer's prefill skips them and its greedy tokens and logprobs are the exporter's. With
// `tp` ranks each side, each rank's wire carries its KV heads.
void ExpectWiresServeTheImporter(int tp, const std::vector<KvQuantOptions>& caches) {
  for (const KvQuantOptions& q : caches) {
    SCOPED_TRACE(absl::StrCat(q.dtype, " ", q.granularity, " tp ", tp));
    std::unique_ptr<Engine> a = testing::MakeEngine(TransferConfig(q, tp));
    std::unique_ptr<Engine> b = testing::MakeEngine(TransferConfig(q, tp));
    ASSERT_TRUE(a && b);
    const int bs = a->config().cache.block_size;
    const std::vector<int32_t> p = TransferPrompt(bs);
    ASSERT_OK(a->AddRequest(testing::GreedyRequest("r", p, 8)));
    testing::Results want = testing::RunToCompletion(*a);
    ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk exported, a->ExportPrefix(p, ""));
    const std::vector<std::string>& wires = exported.wires;
    ASSERT_EQ(wires.size(), static_cast<size_t>(tp));
    const int full = static_cast<int>(p.size()) / bs;
    ASSERT_OK_AND_ASSIGN(int added, b->ImportPrefix(p, "", wires));
    EXPECT_EQ(added, full);
    ASSERT_OK(b->AddRequest(testing::GreedyRequest("r", p, 8)));
    testing::Results got = testing::RunToCompletion(*b, /*check_invariants=*/true);
    EXPECT_EQ(got["r"][0].num_cached_prompt_tokens, full * bs);
    EXPECT_EQ(got["r"][0].tokens, want["r"][0].tokens);
    testing::ExpectSameSamples(got, want, 1e-3);
  }
}

TEST(EngineCudaKvTransferTest, APeersBlocksServeTheRequestAsItsOwnPrefillWould) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectWiresServeTheImporter(1, kEveryTransferCache);
}

TEST(EngineCudaKvTransferTest, WithTensorParallelismEachRankMovesItsHeads) {
  if (kernels::CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ExpectWiresServeTheImporter(2, kTransferCaches);
}

#ifdef KVSERVE_CUDA_EMULATED
// `header` with its fingerprint changed and its checksum made good again: a header that lies
// about the bytes, as a link that corrupted them would make it look.
std::string WithWrongFingerprint(std::string header) {
  header[header.size() - 16] ^= 1;
  const uint64_t sum = XXH3_64bits(header.data(), header.size() - 8);
  std::memcpy(header.data() + header.size() - 8, &sum, 8);
  return header;
}

// The device-to-device path: a prefill engine stages its prompt's blocks and sends them over
// NCCL links made as a worker makes them (MakeKvLinkMaker: one per tensor-parallel rank), and
// a decode engine (its own thread, as a worker's) receives them and serves the request as the
// prefill engine did. A chunk whose last rank's fingerprint does not match is DataLoss and
// caches nothing; the links stay in step. Both engines use the same GPUs of one process, which
// only the emulator allows (NCCL refuses two ranks on one GPU); nccl_peer_link_test runs a
// link's two ends in two processes, kv_link_test two workers.
void ExpectLinksMoveThePrefix(int tp, const std::vector<KvQuantOptions>& caches) {
  for (const KvQuantOptions& q : caches) {
    SCOPED_TRACE(absl::StrCat(q.dtype, " ", q.granularity, " tp ", tp));
    const EngineConfig config = TransferConfig(q, tp);
    const KvLinkMaker maker = MakeKvLinkMaker(config);
    ASSERT_EQ(maker.kind, "nccl");
    std::unique_ptr<Engine> prefill = testing::MakeEngine(config);
    std::unique_ptr<Engine> decode = testing::MakeEngine(config);
    ASSERT_TRUE(prefill && decode);
    decode->HandOver();
    const int bs = prefill->config().cache.block_size;
    const std::vector<int32_t> p = TransferPrompt(bs);
    const int full = static_cast<int>(p.size()) / bs;
    ASSERT_OK(prefill->AddRequest(testing::GreedyRequest("r", p, 8)));
    Results want = testing::RunToCompletion(*prefill);
    ASSERT_OK_AND_ASSIGN(Engine::PrefixChunk chunk, prefill->StagePrefixForLink(p, "", 0, 1000));
    ASSERT_EQ(chunk.num_blocks, full);
    ASSERT_EQ(chunk.wires.size(), static_cast<size_t>(tp));
    std::vector<std::string> forged = chunk.wires;
    forged.back() = WithWrongFingerprint(forged.back());
    ASSERT_OK_AND_ASSIGN(std::string key, maker.new_key());

    absl::StatusOr<int> refused = 0, added = 0;
    int cached_after_refused = -1;
    Results got;
    std::thread decoder([&] {
      absl::StatusOr<KvLink> link = maker.join(key, 1, absl::Seconds(60));
      if (!link.ok()) {
        added = link.status();
        return;
      }
      refused = decode->ReceivePrefixFromLink(*link, p, "", forged, 0);
      cached_after_refused = decode->CachedRun(p, "", 0);
      added = decode->ReceivePrefixFromLink(*link, p, "", chunk.wires, 0);
      if (added.ok() && decode->AddRequest(testing::GreedyRequest("r", p, 8)).ok()) {
        got = testing::RunToCompletion(*decode, /*check_invariants=*/true);
      }
      decode->HandOver();
    });
    ASSERT_OK_AND_ASSIGN(KvLink link, maker.join(key, 0, absl::Seconds(60)));
    ASSERT_EQ(link.size(), static_cast<size_t>(tp));
    EXPECT_OK(prefill->SendStagedPrefix(link));  // the forged header's chunk
    EXPECT_OK(prefill->SendStagedPrefix(link));
    decoder.join();
    EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
    EXPECT_EQ(cached_after_refused, 0);
    ASSERT_OK(added);
    EXPECT_EQ(*added, full);
    ASSERT_EQ(got.count("r"), 1u);
    EXPECT_EQ(got["r"][0].num_cached_prompt_tokens, full * bs);
    EXPECT_EQ(got["r"][0].tokens, want["r"][0].tokens);
    testing::ExpectSameSamples(got, want, 1e-3);
  }
}

TEST(EngineCudaKvTransferTest, ANcclLinkMovesThePrefixDeviceToDevice) {
  ExpectLinksMoveThePrefix(1, kEveryTransferCache);
}

TEST(EngineCudaKvTransferTest, WithTensorParallelismALinkPerRankMovesItsHeads) {
  ExpectLinksMoveThePrefix(2, kTransferCaches);
}

// Layer streaming: the prefill engine prefills in chunks of three blocks, and as each step
// queues a layer's KV writes, that layer's bytes of the blocks the step completes start over
// the links (one per rank). The decode engine (its own thread) queues the same receives when a
// step is announced and caches the blocks once the step's fingerprints come; the last step's
// fingerprints are forged, so its blocks are refused (DataLoss) and released. The decode
// engine then prefills only what did not arrive, and its greedy tokens are an aggregated
// engine's; both engines' KV invariants hold (held blocks counted) and nothing stays held.
void ExpectLayersStreamWhilePrefilling(int tp, const KvQuantOptions& q) {
  SCOPED_TRACE(absl::StrCat(q.dtype, " tp ", tp));
  const EngineConfig config = TransferConfig(q, tp);
  EngineConfig chunked = config;
  chunked.scheduler.max_num_batched_tokens = 3 * 16;
  const KvLinkMaker maker = MakeKvLinkMaker(config);
  ASSERT_EQ(maker.kind, "nccl");
  std::unique_ptr<Engine> aggregated = testing::MakeEngine(config);
  std::unique_ptr<Engine> prefill = testing::MakeEngine(chunked);
  std::unique_ptr<Engine> decode = testing::MakeEngine(config);
  ASSERT_TRUE(aggregated && prefill && decode);
  decode->HandOver();
  const int bs = config.cache.block_size;
  ASSERT_EQ(chunked.scheduler.max_num_batched_tokens, 3 * bs);
  const std::vector<int32_t> p = TransferPrompt(bs);
  const int full = static_cast<int>(p.size()) / bs;
  ASSERT_OK(aggregated->AddRequest(testing::GreedyRequest("r", p, 8)));
  Results want = testing::RunToCompletion(*aggregated);
  ASSERT_OK_AND_ASSIGN(std::string key, maker.new_key());

  absl::Mutex mu;
  std::deque<Engine::StreamStep> steps;  // as the prefill engine announced them
  int announced = 0, added = 0, refused_blocks = 0;
  absl::Status refused;
  Results got;
  std::thread decoder([&] {
    absl::StatusOr<KvLink> link = maker.join(key, 1, absl::Seconds(60));
    absl::Status s = link.status();
    for (bool last = false; s.ok() && !last;) {
      Engine::StreamStep step;
      {
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(
            +[](std::deque<Engine::StreamStep>* q) { return !q->empty(); }, &steps));
        step = steps.front();
        steps.pop_front();
      }
      last = step.last;
      if (step.num_blocks == 0) continue;
      if (step.fingerprints.empty()) {
        s = decode->StartStreamedReceive(*link, p, "", step.first_block, step.num_blocks);
        continue;
      }
      if (last) step.fingerprints[0] ^= 1;  // forged: its blocks must be refused
      absl::StatusOr<std::optional<int>> done = std::nullopt;
      for (int i = 0; i < 60000 && done.ok() && !done->has_value(); ++i) {
        done = decode->FinishStreamedReceive(*link, step.fingerprints);
        if (done.ok() && !done->has_value()) absl::SleepFor(absl::Milliseconds(1));
      }
      if (last && absl::IsDataLoss(done.status())) {
        refused = done.status();
        refused_blocks = step.num_blocks;
      } else if (!done.ok()) {
        s = done.status();
      } else {
        added += done->value_or(0);
      }
    }
    if (s.ok()) s = decode->AddRequest(testing::GreedyRequest("r", p, 8));
    if (s.ok()) got = testing::RunToCompletion(*decode, /*check_invariants=*/true);
    EXPECT_OK(s);
    decode->HandOver();
  });
  ASSERT_OK_AND_ASSIGN(KvLink link, maker.join(key, 0, absl::Seconds(60)));
  ASSERT_OK(prefill->AddRequest(testing::GreedyRequest("r", p, 1)));
  ASSERT_OK(prefill->StreamPrefill("r", 0, link, [&](const Engine::StreamStep& step) {
    absl::MutexLock lock(&mu);
    if (step.fingerprints.empty() && step.num_blocks > 0) ++announced;
    steps.push_back(step);
  }));
  testing::RunToCompletion(*prefill, /*check_invariants=*/true);
  bool drained = false;
  for (int i = 0; i < 60000 && !drained; ++i) {
    ASSERT_OK_AND_ASSIGN(drained, prefill->PollLayerStreams());
    if (!drained) absl::SleepFor(absl::Milliseconds(1));
  }
  decoder.join();
  EXPECT_TRUE(drained) << "the sends never ended";
  EXPECT_OK(prefill->TEST_CheckInvariants()) << "nothing held once the sends are done";
  EXPECT_EQ(announced, (full + 2) / 3) << "a step per three blocks, each streamed";
  EXPECT_TRUE(absl::IsDataLoss(refused)) << refused;
  EXPECT_EQ(added + refused_blocks, full);
  ASSERT_EQ(got.count("r"), 1u);
  EXPECT_EQ(got["r"][0].num_cached_prompt_tokens, added * bs);
  EXPECT_EQ(got["r"][0].tokens, want["r"][0].tokens);
  testing::ExpectSameSamples(got, want, 1e-3);
}

TEST(EngineCudaKvTransferTest, LayersStreamWhileThePrefillComputes) {
  ExpectLayersStreamWhilePrefilling(1, {.dtype = "int4", .granularity = "per_channel"});
  ExpectLayersStreamWhilePrefilling(2, {.dtype = "bf16"});
}
#endif  // KVSERVE_CUDA_EMULATED

}  // namespace
}  // namespace kvserve::worker
