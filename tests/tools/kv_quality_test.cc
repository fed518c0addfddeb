// The quality harness discriminates: over a 2,048-token teacher-forced stream, ungrouped
// per-token int4 keys come out visibly worse than grouped int4, int8 is far closer than int4,
// and the reference row is exact.
#include "tools/bench/kv_quality.h"

#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::bench {
namespace {

TEST(KvQualityTest, Int4PerTokenIsVisiblyWorseThanGrouped) {
  QualityOptions o;
  o.model_dir = kvserve::testing::FixtureModel("tiny-llama3");
  o.num_tokens = 2048;
  o.decode_steps = 0;
  std::vector<KvMode> modes = {
      {"fp32", {}},
      {"int8 per-group", {.dtype = "int8", .granularity = "per_group", .group_size = 8}},
      {"int4 per-token", {.dtype = "int4", .granularity = "per_token"}},
      {"int4 per-group", {.dtype = "int4", .granularity = "per_group", .group_size = 8}},
  };
  ASSERT_OK_AND_ASSIGN(std::vector<ModeQuality> rows, MeasureKvQuality(o, modes));
  ASSERT_EQ(rows.size(), 4u);
  std::cout << FormatQualityTable(rows);
  EXPECT_EQ(rows[0].mean_kl, 0.0);
  EXPECT_EQ(rows[0].top1_agreement, 1.0);
  EXPECT_EQ(rows[0].perplexity_ratio, 1.0);
  EXPECT_EQ(rows[0].memory_vs_fp16, 2.0);
  EXPECT_EQ(rows[2].memory_vs_fp16, 0.375);  // 4 bits + (scale, min) per 16-element row
  // Measured 1.7x (3.1e-2 vs 1.7e-2 nats); "visibly" here means at least 1.3x.
  EXPECT_GT(rows[2].mean_kl, 1.3 * rows[3].mean_kl);
  EXPECT_GT(rows[3].top1_agreement, rows[2].top1_agreement);
  EXPECT_LT(rows[1].mean_kl * 20, rows[3].mean_kl);
}

}  // namespace
}  // namespace kvserve::bench
