// The engine benchmark counts what a decode step reads exactly: the weights bar the embedding
// table, and each sequence's cached tokens during the timed window; it keeps the whole batch
// decoding through chunked prefill, and names bad settings.
#include "tools/bench/engine_bench.h"

#include <iostream>

#include "common/model/hf_config.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "worker/model/step_profile.h"

namespace kvserve::bench {
namespace {

// tiny-llama3 (its config.json): 3 layers, hidden 128, 8 query heads and 2 KV heads of 16
// channels, MLP 344, vocab 1024, untied, no biases.
constexpr int64_t kLayerParams = 128 + 128 * 128 + 2 * 32 * 128 + 128 * 128 + 128 + 3 * 128 * 344;
constexpr int64_t kTable = 1024 * 128;
constexpr int64_t kParams = kTable + 3 * kLayerParams + 128 + kTable;

TEST(EngineBenchTest, DecodeReadsEveryWeightButTheEmbeddingTable) {
  ASSERT_OK_AND_ASSIGN(ModelConfig c, LoadHfConfig(kvserve::testing::FixtureModel("tiny-llama3")));
  ASSERT_EQ(c.intermediate_size, 344);
  EXPECT_EQ(DecodeWeightBytes(c, 4 * kParams), 4 * (kParams - kTable));
  EXPECT_EQ(DecodeWeightBytes(c, 2 * kParams), 2 * (kParams - kTable));
  c.tie_word_embeddings = true;  // the table is the LM head: all of it is read
  EXPECT_EQ(DecodeWeightBytes(c, 4 * (kParams - kTable)), 4 * (kParams - kTable));
}

TEST(EngineBenchTest, CountsTheKvEachDecodeStepReads) {
  EngineBenchOptions o;
  o.model_dir = kvserve::testing::FixtureModel("tiny-llama3");
  o.kv_cache_dtypes = {"auto", "int8"};
  o.batches = {1, 3};
  o.contexts = {20, 70};
  o.warmup_steps = 2;
  o.decode_steps = 3;
  int rows_seen = 0;
  o.on_row = [&](const EngineBenchRow&) { ++rows_seen; };
  ASSERT_OK_AND_ASSIGN(EngineBenchReport r, RunEngineBench(o));
  std::cout << FormatEngineBench(r);
  ASSERT_EQ(r.rows.size(), 8u);
  EXPECT_EQ(rows_seen, 8);
  EXPECT_GT(r.copy_gbps, 0);
  EXPECT_EQ(r.weight_bytes, 4 * kParams);  // float32 on the CPU
  EXPECT_EQ(r.weight_bytes_read, 4 * (kParams - kTable));
  for (const EngineBenchRow& w : r.rows) {
    SCOPED_TRACE(w.kv_cache_dtype + " " + std::to_string(w.batch) + " x " +
                 std::to_string(w.context));
    // fp32: 3 layers × (K, V) × 2 heads × 16 channels × 4 bytes; int8 per-token: 16 codes and
    // a 2-byte scale per row (kv_quant.h).
    const double per_token = w.kv_cache_dtype == "auto" ? 3 * 2 * 2 * 16 * 4 : 3 * 2 * 2 * 18;
    // Step k of 3 reads context + 2 warm-up tokens + k + 1 per sequence: on average + 2.
    EXPECT_DOUBLE_EQ(w.step_kv_bytes, per_token * w.batch * (w.context + 2 + 2));
    EXPECT_DOUBLE_EQ(w.step_bytes, w.step_kv_bytes + static_cast<double>(r.weight_bytes_read));
    EXPECT_GT(w.prefill_tokens_per_s, 0);
    EXPECT_GT(w.decode_ms_per_step, 0);
    EXPECT_NEAR(w.decode_tokens_per_s, w.batch / (1e-3 * w.decode_ms_per_step), 1e-6);
    EXPECT_DOUBLE_EQ(w.fraction_of_copy, w.gbps / r.copy_gbps);
    EXPECT_GT(w.start_s, 0);
  }
  EXPECT_EQ(r.rows[0].start_s, r.rows[3].start_s) << "one engine per KV cache dtype";
  EXPECT_NE(r.rows[0].start_s, r.rows[4].start_s);
  EXPECT_EQ(r.rows[0].kv_format, "fp32");
  EXPECT_EQ(r.rows[4].kv_format, "int8/per_token");
}

// Prefill chunks of 64 tokens: 3 × 70 prompt tokens take 4 steps, during which the sequences
// prefilled first already decode. None may finish, or be short of a token, inside the timed
// window.
TEST(EngineBenchTest, KeepsTheWholeBatchThroughChunkedPrefill) {
  EngineBenchOptions o;
  o.model_dir = kvserve::testing::FixtureModel("tiny-llama3");
  o.batches = {3};
  o.contexts = {70};
  o.max_num_batched_tokens = 64;
  o.warmup_steps = 0;
  o.decode_steps = 4;
  ASSERT_OK_AND_ASSIGN(EngineBenchReport r, RunEngineBench(o));
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_GT(r.rows[0].decode_tokens_per_s, 0);
}

// The host path by phase: every phase reported, none negative, together within the step's
// wall time. The null device runs no model, so its model phases are empty; the CPU backend's
// forward pass is its launch phase. Prefix caching on, as served: each sequence fills one block
// in the 16 timed steps (positions 22..37 computed, block 1 full after position 31), a KV
// event each.
TEST(EngineBenchTest, ProfilesTheHostPathByPhase) {
  for (const std::string device : {"null", "cpu"}) {
    SCOPED_TRACE(device);
    EngineBenchOptions o;
    o.model_dir = kvserve::testing::FixtureModel("tiny-llama3");
    o.device = device;
    o.batches = {3};
    o.contexts = {20};
    o.warmup_steps = 2;
    o.decode_steps = 16;
    ASSERT_OK_AND_ASSIGN(EngineBenchReport r, RunEngineBench(o));
    std::cout << FormatEngineBench(r);
    ASSERT_EQ(r.rows.size(), 1u);
    const EngineBenchRow& w = r.rows[0];
    ASSERT_EQ(w.phase_us.size(), static_cast<size_t>(worker::StepPhase::kCount));
    double sum = 0;
    for (double us : w.phase_us) {
      EXPECT_GE(us, 0);
      sum += us;
    }
    EXPECT_LE(sum, w.host_us_per_step * (1 + 1e-9));
    EXPECT_GT(w.host_cpu_us_per_step, 0);
    EXPECT_DOUBLE_EQ(w.kv_events_per_step, 3.0 / 16);
    const double model = w.phase_us[static_cast<int>(worker::StepPhase::kInputs)] +
                         w.phase_us[static_cast<int>(worker::StepPhase::kLaunch)] +
                         w.phase_us[static_cast<int>(worker::StepPhase::kDownload)];
    if (device == "null") {
      EXPECT_EQ(model, 0);
    } else {
      EXPECT_GT(w.phase_us[static_cast<int>(worker::StepPhase::kLaunch)], 0);
    }
  }
}

TEST(EngineBenchTest, NamesBadSettings) {
  EngineBenchOptions o;
  o.model_dir = kvserve::testing::FixtureModel("tiny-llama3");
  o.batches = {0};
  EXPECT_THAT(RunEngineBench(o).status().message(), ::testing::HasSubstr("--batches"));
  o.batches = {1};
  o.contexts = {};
  EXPECT_THAT(RunEngineBench(o).status().message(), ::testing::HasSubstr("--contexts"));
  o.contexts = {5000};  // the model's max_position_embeddings is 4096
  EXPECT_FALSE(RunEngineBench(o).ok());
  o.contexts = {16};
  o.kv_cache_dtypes = {"int3"};
  EXPECT_THAT(RunEngineBench(o).status().message(), ::testing::HasSubstr("int3"));
}

}  // namespace
}  // namespace kvserve::bench
