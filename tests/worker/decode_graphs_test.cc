// DecodeGraphs (worker/model/decode_graphs.h) on the CPU backend, whose memory the test can
// read: which batches replay, their buckets, and the padded layout a graph reads. Replays
// themselves run in engine_launches_test and engine_cuda_test (CUDA and emulated builds).
#include "worker/model/decode_graphs.h"

#include "gtest/gtest.h"

namespace kvserve::worker {
namespace {

// `seqs` sequences decoding one token each, sequence s with `blocks` blocks and a context of
// blocks · 16 − s tokens.
ForwardBatch Decode(int seqs, int blocks) {
  ForwardBatch b;
  b.max_blocks_per_seq = blocks;
  for (int s = 0; s < seqs; ++s) {
    b.token_ids.push_back(100 + s);
    b.positions.push_back(blocks * 16 - s - 1);
    b.slot_mapping.push_back(int64_t{s} * 1000 + 7);
    b.query_start.push_back(s);
    b.query_len.push_back(1);
    b.context_len.push_back(blocks * 16 - s);
    for (int i = 0; i < blocks; ++i) b.block_tables.push_back(s * 100 + i);
    b.logit_rows.push_back(s);
    b.samples.push_back({.row = s, .temperature = 0.5f, .seed = 9});
  }
  return b;
}

class DecodeGraphsTest : public ::testing::Test {
 protected:
  std::unique_ptr<kernels::Backend> cpu_ = kernels::CreateCpuBackend({});
  DecodeGraphs graphs_{cpu_.get(), {.max_batch = 12, .max_blocks_per_seq = 40}};
};

TEST(DecodeGraphBucketsTest, BatchesRoundUpToPowersOfTwoThenEights) {
  const int64_t expected[][2] = {{1, 1}, {2, 2},  {3, 4},   {4, 4},     {5, 8},
                                 {8, 8}, {9, 16}, {17, 24}, {250, 256}, {256, 256}};
  for (const auto& [seqs, bucket] : expected) {
    EXPECT_EQ(DecodeGraphs::BatchBucket(seqs, 256), bucket) << seqs;
  }
  EXPECT_EQ(DecodeGraphs::BatchBucket(9, 12), 12) << "the largest bucket is max_batch";
}

TEST(DecodeGraphBucketsTest, WidthsArePowersOfTwoFromTheMinimum) {
  EXPECT_EQ(DecodeGraphs::WidthBucket(1, 8192), DecodeGraphs::kMinWidth);
  EXPECT_EQ(DecodeGraphs::WidthBucket(9, 8192), 16);
  EXPECT_EQ(DecodeGraphs::WidthBucket(65, 8192), 128);
  EXPECT_EQ(DecodeGraphs::WidthBucket(65, 100), 100) << "the widest is max_blocks_per_seq";
}

// Every bucket once, the largest first (the recording order at start-up).
TEST(DecodeGraphBucketsTest, EveryBucketLargestFirst) {
  using B = DecodeGraphs::Bucket;
  EXPECT_EQ(DecodeGraphs::Buckets(12, 20), (std::vector<B>{{12, 20},
                                                           {12, 16},
                                                           {12, 8},
                                                           {8, 20},
                                                           {8, 16},
                                                           {8, 8},
                                                           {4, 20},
                                                           {4, 16},
                                                           {4, 8},
                                                           {2, 20},
                                                           {2, 16},
                                                           {2, 8},
                                                           {1, 20},
                                                           {1, 16},
                                                           {1, 8}}));
  EXPECT_EQ(DecodeGraphs::Buckets(1, 4), (std::vector<B>{{1, 4}}));
  // vLLM's default scheduler (256 sequences) at 8K tokens in blocks of 16: 35 batch buckets
  // (1, 2, 4, 8, 16, ..., 256) times 7 widths (8 ... 512 blocks).
  EXPECT_EQ(DecodeGraphs::Buckets(256, 512).size(), 35u * 7u);
}

TEST_F(DecodeGraphsTest, OnlyPureDecodeBatchesWithinTheBucketsFit) {
  EXPECT_TRUE(graphs_.Fits(Decode(5, 3)));
  EXPECT_TRUE(graphs_.Fits(Decode(12, 40)));
  EXPECT_FALSE(graphs_.Fits(Decode(13, 3))) << "more sequences than max_batch";
  EXPECT_FALSE(graphs_.Fits(Decode(2, 41))) << "wider than max_blocks_per_seq";
  EXPECT_FALSE(graphs_.Fits(ForwardBatch{})) << "empty";

  ForwardBatch prefill = Decode(3, 3);
  prefill.query_len[2] = 2;
  prefill.token_ids.push_back(1);
  EXPECT_FALSE(graphs_.Fits(prefill)) << "a sequence with two query tokens";

  ForwardBatch prompt_logits = Decode(3, 3);
  prompt_logits.host_logit_rows = {0};
  EXPECT_FALSE(graphs_.Fits(prompt_logits)) << "logits that come back to the host";

  ForwardBatch skipped_row = Decode(3, 3);
  skipped_row.logit_rows = {0, 2, 2};
  EXPECT_FALSE(graphs_.Fits(skipped_row)) << "logits rows out of sequence order";

  ForwardBatch many_samples = Decode(3, 3);
  many_samples.samples.resize(2 * 12 + 1);
  EXPECT_FALSE(graphs_.Fits(many_samples)) << "more draws than the buffer holds";
}

TEST_F(DecodeGraphsTest, PreparePadsTheBatchToItsBucket) {
  const ForwardBatch b = Decode(5, 3);
  const DecodeGraphs::Step step = graphs_.Prepare(b, 16, this);
  const StepInputs& in = step.inputs;
  ASSERT_EQ(in.num_seqs, 8);
  EXPECT_EQ(in.tokens, 8);
  EXPECT_EQ(in.num_logit_rows, 8);
  EXPECT_EQ(in.max_blocks_per_seq, DecodeGraphs::kMinWidth);
  EXPECT_EQ(in.max_query_len, 1);
  EXPECT_EQ(in.max_context_len, DecodeGraphs::kMinWidth * 16);
  for (int r = 0; r < 8; ++r) {
    const bool real = r < 5;
    EXPECT_EQ(in.token_ids[r], real ? b.token_ids[r] : 0) << r;
    EXPECT_EQ(in.positions[r], real ? b.positions[r] : 0) << r;
    EXPECT_EQ(in.slot_mapping[r], real ? b.slot_mapping[r] : -1) << r;
    EXPECT_EQ(in.query_start[r], r);
    EXPECT_EQ(in.query_len[r], real ? 1 : 0) << r;
    EXPECT_EQ(in.context_len[r], real ? b.context_len[r] : 0) << r;
    EXPECT_EQ(in.logit_rows[r], r);
  }
  for (int s = 0; s < 5; ++s) {
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(in.block_tables[s * in.max_blocks_per_seq + i], s * 100 + i) << s << " " << i;
    }
  }
  EXPECT_EQ(step.samples[4].row, 4);
  EXPECT_EQ(step.samples[4].seed, 9u);
  EXPECT_EQ(step.bucket, (DecodeGraphs::Bucket{8, DecodeGraphs::kMinWidth}));
  EXPECT_EQ(graphs_.Find(step).graph, -1) << "nothing recorded yet";
}

TEST_F(DecodeGraphsTest, OneGraphPerBucketUntilTheCacheChanges) {
  auto graph = [&](int seqs, int blocks, const void* cache) {
    return graphs_.Find(graphs_.Prepare(Decode(seqs, blocks), 16, cache)).graph;
  };
  graphs_.Record(graphs_.Prepare(Decode(5, 3), 16, this), {42, nullptr});
  EXPECT_EQ(graph(7, 8, this), 42) << "same buckets (8, 8)";
  EXPECT_EQ(graph(7, 9, this), -1) << "width 16";
  graphs_.Record(graphs_.Prepare(Decode(9, 3), 16, this), {43, nullptr});
  EXPECT_EQ(graph(9, 3, this), 43) << "batch 12";
  EXPECT_EQ(graphs_.size(), 2u);
  int other_cache = 0;
  EXPECT_EQ(graph(5, 3, &other_cache), -1) << "another KV storage";
  EXPECT_EQ(graphs_.size(), 0u);
}

}  // namespace
}  // namespace kvserve::worker
