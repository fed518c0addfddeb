// What the router reads from an OpenAI upstream it does not run: vLLM-format KV events
// re-hashed into kvserve's block hashes (VllmEventTranslator), and the upstream's load from its
// Prometheus /metrics (ParsePrometheusText, VllmLoad).
#include <cmath>
#include <numeric>
#include <vector>

#include "common/kv/block_hash.h"
#include "common/kv/vllm_kv_events.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/routing/prefix_index.h"
#include "tests/testing/status_matchers.h"
#include "upstream/vllm_event_source.h"
#include "upstream/vllm_event_translator.h"
#include "upstream/vllm_load.h"

namespace kvserve::upstream {
namespace {

using router::PrefixIndex;

using vllm_events::Event;
constexpr int kBlock = 4;

// A run of stored blocks as a vLLM engine reports them: its own hashes (any numbers: the
// translator must not depend on them), the parent's, the tokens.
Event Stored(std::vector<int64_t> engine_hashes, std::optional<int64_t> parent,
             std::vector<int32_t> tokens, std::string medium = "GPU", int block_size = kBlock) {
  Event e;
  e.kind = Event::Kind::kStored;
  e.block_hashes = std::move(engine_hashes);
  e.parent_block_hash = parent;
  e.token_ids = std::move(tokens);
  e.block_size = block_size;
  e.medium = std::move(medium);
  return e;
}

Event Removed(std::vector<int64_t> engine_hashes, std::string medium = "GPU") {
  Event e;
  e.kind = Event::Kind::kRemoved;
  e.block_hashes = std::move(engine_hashes);
  e.medium = std::move(medium);
  return e;
}

std::vector<uint32_t> Iota(int n, uint32_t from = 100) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> Signed(const std::vector<uint32_t>& v, size_t from, size_t n) {
  return std::vector<int32_t>(v.begin() + from, v.begin() + from + n);
}

std::vector<std::string> Bytes(const std::vector<BlockHash>& hashes) {
  std::vector<std::string> out;
  for (const BlockHash& h : hashes) out.push_back(h.ToBytes());
  return out;
}

class TranslatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(
        extra_,
        (CacheKey{.model_id = "upstream-model", .kv_cache_dtype = "auto", .block_size = kBlock}
             .Serialize()));
  }
  std::string extra_;
};

TEST_F(TranslatorTest, StoredChainsHashAsTheRouterHashesThePrompt) {
  VllmEventTranslator t(extra_, kBlock);
  const std::vector<uint32_t> prompt = Iota(5 * kBlock);
  const std::vector<BlockHash> want = HashFullBlocks(prompt, kBlock, extra_);
  // Two blocks, then three more chained on the second, as a prefill and a later decode store.
  std::vector<kvserve::v1::KvEvent> out =
      t.Translate({Stored({-5, 77}, std::nullopt, Signed(prompt, 0, 2 * kBlock)),
                   Stored({9, 1LL << 62, 3}, 77, Signed(prompt, 2 * kBlock, 3 * kBlock))});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].has_stored());
  EXPECT_THAT(out[0].stored().block_hashes(),
              ::testing::ElementsAreArray(Bytes({want[0], want[1]})));
  EXPECT_TRUE(out[0].stored().parent_block_hash().empty());
  EXPECT_EQ(out[1].stored().parent_block_hash(), want[1].ToBytes());
  EXPECT_THAT(out[1].stored().block_hashes(),
              ::testing::ElementsAreArray(Bytes({want[2], want[3], want[4]})));
  EXPECT_EQ(out[1].stored().medium(), kvserve::v1::MEDIUM_DEVICE);
  EXPECT_EQ(out[1].stored().token_ids_size(), 3 * kBlock);
  EXPECT_EQ(t.counters().stored, 5);
  EXPECT_EQ(t.size(), 5u);

  // The router's index, fed these events, finds the whole prompt on this worker.
  PrefixIndex index;
  kvserve::v1::KvSnapshot empty;  // the router's start: an empty snapshot at seq 0
  index.ApplySnapshot(0, empty);
  kvserve::v1::KvEventBatch batch;
  batch.set_seq(1);
  for (auto& e : out) *batch.add_events() = e;
  EXPECT_EQ(index.ApplyEvents(0, batch), PrefixIndex::Apply::kApplied);
  EXPECT_EQ(index.LongestPrefix(0, want).device_blocks, 5);
}

TEST_F(TranslatorTest, RemovalsNameTheRouterHashesAndMediaAreKeptApart) {
  VllmEventTranslator t(extra_, kBlock);
  const std::vector<uint32_t> prompt = Iota(2 * kBlock);
  const std::vector<BlockHash> want = HashFullBlocks(prompt, kBlock, extra_);
  t.Translate({Stored({1, 2}, std::nullopt, Signed(prompt, 0, 2 * kBlock)),
               Stored({2}, 1, Signed(prompt, kBlock, kBlock), "CPU")});
  std::vector<kvserve::v1::KvEvent> out = t.Translate({Removed({2, 404})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].removed().block_hashes(), ::testing::ElementsAre(want[1].ToBytes()));
  EXPECT_EQ(out[0].removed().medium(), kvserve::v1::MEDIUM_DEVICE);
  EXPECT_EQ(t.counters().unknown_removed, 1);
  // Block 2 is still cached on the host: the snapshot says so.
  std::vector<kvserve::v1::CachedBlock> snap = t.Snapshot();
  ASSERT_EQ(snap.size(), 2u);
  int host = 0;
  for (const auto& c : snap) {
    if (c.medium() == kvserve::v1::MEDIUM_HOST) {
      ++host;
      EXPECT_EQ(c.block_hash(), want[1].ToBytes());
    }
  }
  EXPECT_EQ(host, 1);
  out = t.Translate({Removed({2}, "CPU")});
  EXPECT_EQ(out[0].removed().medium(), kvserve::v1::MEDIUM_HOST);
  EXPECT_EQ(t.size(), 1u);
}

// vLLM can cache one block twice (two concurrent prompts compute it) and removes each copy
// apart: the router hears of the removal only when the last copy goes.
TEST_F(TranslatorTest, ABlockCachedTwiceStaysUntilItsLastCopyIsRemoved) {
  VllmEventTranslator t(extra_, kBlock);
  const std::vector<uint32_t> prompt = Iota(kBlock);
  const BlockHash want = HashFullBlocks(prompt, kBlock, extra_)[0];
  t.Translate({Stored({7}, std::nullopt, Signed(prompt, 0, kBlock)),
               Stored({7}, std::nullopt, Signed(prompt, 0, kBlock))});
  EXPECT_TRUE(t.Translate({Removed({7})}).empty());  // one copy left
  EXPECT_EQ(t.Snapshot().size(), 1u);
  std::vector<kvserve::v1::KvEvent> out = t.Translate({Removed({7})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].removed().block_hashes(), ::testing::ElementsAre(want.ToBytes()));
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.counters().unknown_removed, 0);
  EXPECT_TRUE(t.Translate({Removed({7})}).empty());  // a third removal: unknown
  EXPECT_EQ(t.counters().unknown_removed, 1);
}

TEST_F(TranslatorTest, OrphansAndOtherBlockSizesAreSkippedAndCounted) {
  VllmEventTranslator t(extra_, kBlock);
  const std::vector<uint32_t> prompt = Iota(3 * kBlock);
  EXPECT_TRUE(
      t.Translate({Stored({8, 9}, /*parent=*/1234, Signed(prompt, 0, 2 * kBlock))}).empty());
  EXPECT_EQ(t.counters().orphans, 2);
  EXPECT_TRUE(
      t.Translate({Stored({8}, std::nullopt, Signed(prompt, 0, 2 * kBlock), "GPU", 2 * kBlock)})
          .empty());
  EXPECT_TRUE(t.Translate({Stored({8, 9}, std::nullopt, Signed(prompt, 0, kBlock + 1))}).empty());
  EXPECT_EQ(t.counters().wrong_size, 3);
  EXPECT_EQ(t.size(), 0u);
}

TEST_F(TranslatorTest, AllBlocksClearedForgetsEverything) {
  VllmEventTranslator t(extra_, kBlock);
  const std::vector<uint32_t> prompt = Iota(kBlock);
  Event cleared;
  cleared.kind = Event::Kind::kAllCleared;
  std::vector<kvserve::v1::KvEvent> out =
      t.Translate({Stored({1}, std::nullopt, Signed(prompt, 0, kBlock)), cleared});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[1].has_all_cleared());
  EXPECT_EQ(t.size(), 0u);
  EXPECT_TRUE(t.Translate({Removed({1})}).empty());
}

TEST_F(TranslatorTest, ReadsWhatTheWorkersOwnPublisherEncodes) {
  // The worker's vLLM-format events (encoded, decoded) through the translator give back the
  // hashes the worker computed, when both use the same extra key.
  const std::vector<uint32_t> prompt = Iota(3 * kBlock, 7);
  const std::vector<BlockHash> ours = HashFullBlocks(prompt, kBlock, extra_);
  vllm_events::Batch batch;
  for (int i = 0; i < 3; ++i) {
    vllm_events::AddStoredBlock(batch.events, ours[i],
                                i ? std::optional(ours[i - 1]) : std::nullopt,
                                Signed(prompt, i * kBlock, kBlock), kBlock, "GPU");
  }
  for (auto encoding : {vllm_events::Encoding::kMap, vllm_events::Encoding::kArray}) {
    ASSERT_OK_AND_ASSIGN(vllm_events::Batch decoded,
                         vllm_events::Decode(vllm_events::Encode(batch, encoding)));
    VllmEventTranslator t(extra_, kBlock);
    std::vector<kvserve::v1::KvEvent> out = t.Translate(decoded.events);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_THAT(out[0].stored().block_hashes(), ::testing::ElementsAreArray(Bytes(ours)));
  }
}

constexpr char kVllmMetrics[] =
    R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0 1712345678000
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="0",num_gpu_blocks="1000",prefix="a \"q\" \\ b\nc"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="1",num_gpu_blocks="1200",} 1.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 7
process_cpu_seconds_total 12.5
process_start_time_seconds 1.7123456789e+09
odd_value NaN
)";

// A data-parallel pod: rank r's events and replays at the given ports + r; an endpoint without a
// port cannot be shifted (refused by name), and one rank keeps any endpoint.
TEST(RankEndpointsTest, RankRIsAtThePortsPlusR) {
  ASSERT_OK_AND_ASSIGN(
      std::vector<VllmEventEndpoints> ranks,
      RankEndpoints(
          {.events = "tcp://10.0.0.5:5557", .replay = "tcp://10.0.0.5:5600", .bind = true}, 3));
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2].events, "tcp://10.0.0.5:5559");
  EXPECT_EQ(ranks[2].replay, "tcp://10.0.0.5:5602");
  EXPECT_TRUE(ranks[1].bind);
  ASSERT_OK_AND_ASSIGN(ranks, RankEndpoints({.events = "tcp://10.0.0.5:5557"}, 2));
  EXPECT_EQ(ranks[1].replay, "");  // no replay socket: none for any rank
  ASSERT_OK_AND_ASSIGN(ranks, RankEndpoints({.events = "ipc:///tmp/ev.sock"}, 1));
  EXPECT_EQ(ranks[0].events, "ipc:///tmp/ev.sock");
  EXPECT_THAT(RankEndpoints({.events = "ipc:///tmp/ev.sock"}, 2).status(),
              kvserve::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                         ::testing::HasSubstr("needs tcp://HOST:PORT")));
  EXPECT_FALSE(RankEndpoints({.events = "tcp://h:1"}, 0).ok());
}

TEST(PrometheusTextTest, ReadsVllmsLoadSummedOverEngines) {
  ASSERT_OK_AND_ASSIGN(std::vector<Sample> samples, ParsePrometheusText(kVllmMetrics));
  ASSERT_EQ(samples.size(), 12u);
  EXPECT_EQ(*samples[6].label("prefix"), "a \"q\" \\ b\nc");
  EXPECT_EQ(*samples[8].label("le"), "+Inf");
  EXPECT_EQ(samples[8].value, 7);
  EXPECT_TRUE(std::isnan(samples[11].value));
  UpstreamLoad load = VllmLoad(samples);
  EXPECT_EQ(load.running, 5);
  EXPECT_EQ(load.waiting, 4);
  EXPECT_DOUBLE_EQ(*load.kv_usage, 0.375);
  EXPECT_EQ(load.num_gpu_blocks, 2200);
  EXPECT_EQ(load.block_size, 16);
  EXPECT_EQ(load.cache_dtype, "fp8");
  EXPECT_DOUBLE_EQ(*load.start_time, 1.7123456789e+09);  // a new value: a new process
}

TEST(PrometheusTextTest, OlderNamesAndAbsentFamilies) {
  ASSERT_OK_AND_ASSIGN(std::vector<Sample> samples,
                       ParsePrometheusText("vllm:gpu_cache_usage_perc 0.9\n"));
  UpstreamLoad load = VllmLoad(samples);
  EXPECT_DOUBLE_EQ(*load.kv_usage, 0.9);
  EXPECT_FALSE(load.running.has_value());
  EXPECT_FALSE(load.block_size.has_value());
}

TEST(PrometheusTextTest, MalformedLinesAreNamed) {
  for (const char* bad : {"no_value\n", "x{a=\"1\" 3\n", "x{a=1} 3\n", "x 1 2 3\n", "x abc\n",
                          "{a=\"1\"} 3\n", "x{a=\"unterminated} 3\n"}) {
    absl::StatusOr<std::vector<Sample>> s = ParsePrometheusText(std::string("ok 1\n") + bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.status().message(), ::testing::HasSubstr("metrics line 2")) << bad;
  }
  EXPECT_THAT(ParsePrometheusText("a 1\nb 2\nc 3\n", 2).status().message(),
              ::testing::HasSubstr("over 2 samples"));
}

}  // namespace
}  // namespace kvserve::upstream
