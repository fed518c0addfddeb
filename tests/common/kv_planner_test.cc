#include "common/kv/kv_planner.h"

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

PlanInput Llama3_8B() {
  PlanInput in;
  in.num_layers = 32;
  in.num_kv_heads = 8;
  in.head_dim = 128;
  in.quant.dtype = "fp16";
  return in;
}

TEST(KvPlannerTest, Llama3_8BFourSequencesOf8K) {
  PlanInput in = Llama3_8B();
  in.num_seqs = 4;
  in.seq_len = 8192;
  ASSERT_OK_AND_ASSIGN(PlanResult r, PlanKvCache(in));
  EXPECT_EQ(r.kv_bytes_per_token, 2 * 32 * 8 * 128 * 2);  // 128 KiB
  EXPECT_EQ(r.kv_bytes_per_layer_per_request, 32 * kMiB);
  EXPECT_EQ(r.kv_cache_bytes, 4 * kGiB);
}

TEST(KvPlannerTest, HundredSequencesOf2KIsTwentyFiveGiBNotSixteen) {
  PlanInput in = Llama3_8B();
  in.num_seqs = 100;
  in.seq_len = 2048;
  ASSERT_OK_AND_ASSIGN(PlanResult r, PlanKvCache(in));
  EXPECT_EQ(r.kv_cache_bytes, 25 * kGiB);  // 100 × 2048 × 128 KiB = 25.0 GiB
  EXPECT_NE(r.kv_cache_bytes, 16 * kGiB);  // the widely copied slip
}

TEST(KvPlannerTest, MhaNeedsFourTimesGqa) {
  PlanInput gqa = Llama3_8B();
  PlanInput mha = gqa;
  mha.num_kv_heads = 32;
  ASSERT_OK_AND_ASSIGN(PlanResult a, PlanKvCache(gqa));
  ASSERT_OK_AND_ASSIGN(PlanResult b, PlanKvCache(mha));
  EXPECT_EQ(b.kv_cache_bytes, 4 * a.kv_cache_bytes);
  EXPECT_EQ(b.kv_bytes_per_token, 4 * a.kv_bytes_per_token);
}

TEST(KvPlannerTest, Int8PerGroup128CostsHalfPlusOne128thOfFp16) {
  PlanInput fp16 = Llama3_8B();
  PlanInput int8 = fp16;
  int8.quant = {.dtype = "int8", .granularity = "per_group", .group_size = 128};
  ASSERT_OK_AND_ASSIGN(PlanResult a, PlanKvCache(fp16));
  ASSERT_OK_AND_ASSIGN(PlanResult b, PlanKvCache(int8));
  EXPECT_EQ(b.kv_bytes_per_token * 128, a.kv_bytes_per_token * (64 + 1));  // × (1/2 + 1/128)
  EXPECT_EQ(b.kv_format, "int8/per_group:128");
}

TEST(KvPlannerTest, TensorParallelSplitsOrReplicatesHeads) {
  PlanInput in = Llama3_8B();
  in.tensor_parallel_size = 4;
  ASSERT_OK_AND_ASSIGN(PlanResult r, PlanKvCache(in));
  EXPECT_EQ(r.kv_heads_per_rank, 2);
  EXPECT_EQ(r.kv_bytes_per_token_per_rank * 4, r.kv_bytes_per_token);
  in.num_kv_heads = 2;
  in.tensor_parallel_size = 8;
  ASSERT_OK_AND_ASSIGN(r, PlanKvCache(in));
  EXPECT_TRUE(r.kv_heads_replicated);
  EXPECT_EQ(r.kv_heads_per_rank, 1);
  in.tensor_parallel_size = 3;
  EXPECT_THAT(PlanKvCache(in),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tensor-parallel-size 3")));
}

TEST(KvPlannerTest, BlocksAndConcurrencyOnAGpu) {
  PlanInput in = Llama3_8B();
  in.num_params = 8'030'000'000;  // Llama-3-8B
  in.gpu_memory_gib = 80;
  in.gpu_memory_utilization = 0.9;
  in.seq_len = 8192;
  in.num_seqs = 32;
  ASSERT_OK_AND_ASSIGN(PlanResult r, PlanKvCache(in));
  // 72 GiB - 14.96 GiB weights - 1.5 GiB reserves = 55.5 GiB of 2 MiB blocks.
  EXPECT_EQ(r.kv_block_bytes_per_rank, 2 * kMiB);
  EXPECT_EQ(r.blocks_per_rank, r.kv_budget_bytes_per_rank / (2 * kMiB));
  EXPECT_EQ(r.max_concurrency, r.blocks_per_rank / 512);
  EXPECT_EQ(r.max_concurrency, 55);
  EXPECT_TRUE(r.fits);
}

}  // namespace
}  // namespace kvserve
