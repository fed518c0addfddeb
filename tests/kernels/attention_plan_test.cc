// The host side of the CUDA paged-attention launcher, which runs without a GPU: how a launch
// is cut (rows per thread block, split-KV factor, workspace) and which shapes are refused.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention/paged_attention.h"

namespace kvserve::kernels::cuda {
namespace {

AttnArgs Decode(int seqs, int context, int heads = 32, int kv_heads = 8) {
  AttnArgs a;
  a.num_seqs = seqs;
  a.num_heads = heads;
  a.num_kv_heads = kv_heads;
  a.head_dim = 128;
  a.block_size = 16;
  a.max_query_len = 1;
  a.max_context_len = context;
  a.k_layout.dtype = a.v_layout.dtype = KvDType::kBf16;
  return a;
}

TEST(AttentionPlanTest, DecodeSplitsUntilTheGpuIsFull) {
  const size_t big = size_t{1} << 30;
  // One sequence of 64K tokens, 8 KV heads: 8 blocks alone would leave 132 SMs idle.
  AttnPlan p = PlanPagedAttention(Decode(1, 65536), 132, big);
  EXPECT_EQ(p.rows_per_block, 4);  // a GQA group of 4 query heads per block
  EXPECT_EQ(p.row_tiles, 1);
  // Aiming at 8 blocks per SM (1,056) asks for 132 splits; splits get whole chunks of 256
  // tokens, equal in number: 2 chunks each, 128 splits, 1,024 blocks.
  EXPECT_EQ(p.chunks_per_split, 2);
  EXPECT_EQ(p.num_splits, 128);
  EXPECT_GE(p.num_splits * p.chunks_per_split * kChunkTokens, 65536);  // covers the context
  EXPECT_EQ(p.workspace_floats, size_t{32} * p.num_splits * (128 + 2));
  // A big batch fills the GPU on its own: no split, no workspace.
  AttnPlan q = PlanPagedAttention(Decode(256, 1024), 132, big);
  EXPECT_EQ(q.num_splits, 1);
  EXPECT_EQ(q.workspace_floats, 0u);
  // More blocks per SM asked for: more splits.
  AttnPlan r = PlanPagedAttention(Decode(16, 4096), 132, big, 32);
  AttnPlan s = PlanPagedAttention(Decode(16, 4096), 132, big, 8);
  EXPECT_GT(r.num_splits, s.num_splits);
}

TEST(AttentionPlanTest, WorkspaceCapTradesSplitsForLongerBlocks) {
  AttnPlan p = PlanPagedAttention(Decode(1, 65536), 132, /*max_workspace_floats=*/32 * 130 * 4);
  EXPECT_EQ(p.num_splits, 4);
  EXPECT_EQ(p.chunks_per_split, 64);  // 4 × 64 chunks of 256 tokens = 64K
  EXPECT_LE(p.workspace_floats, size_t{32} * 130 * 4);
  AttnPlan none = PlanPagedAttention(Decode(1, 65536), 132, 0);
  EXPECT_EQ(none.num_splits, 1);
  EXPECT_EQ(none.chunks_per_split, 256);
}

TEST(AttentionPlanTest, PrefillAndWideGroupsUseEightRows) {
  AttnArgs a = Decode(2, 1000);
  a.max_query_len = 100;  // a prefill chunk: 100 tokens × 4 heads = 400 rows
  AttnPlan p = PlanPagedAttention(a, 132, size_t{1} << 30);
  EXPECT_EQ(p.rows_per_block, 8);
  EXPECT_EQ(p.row_tiles, 50);
  AttnPlan g = PlanPagedAttention(Decode(4, 1000, 64, 8), 132, size_t{1} << 30);  // GQA 8:1
  EXPECT_EQ(g.rows_per_block, 8);
  EXPECT_EQ(g.row_tiles, 1);
  // Small heads (16 / 32 channels: small models) always take 8 rows: the launcher has no
  // 4-row kernel for them.
  for (int d : {16, 32}) {
    AttnArgs small = Decode(4, 1000);
    small.head_dim = d;
    EXPECT_STREQ(CheckAttentionShape(small), "");
    EXPECT_EQ(PlanPagedAttention(small, 132, size_t{1} << 30).rows_per_block, 8);
    EXPECT_FALSE(PlanPagedAttention(small, 132, size_t{1} << 30, 0, true).tensor_cores);
  }
}

TEST(AttentionPlanTest, TensorCoresTakeSixteenRowsWhereTheyCoverTheCache) {
  const size_t big = size_t{1} << 30;
  AttnArgs a = Decode(2, 1000);
  a.max_query_len = 100;
  AttnPlan p = PlanPagedAttention(a, 132, big, 0, /*tensor_cores=*/true);
  EXPECT_TRUE(p.tensor_cores);
  EXPECT_EQ(p.rows_per_block, 64);  // a prefill chunk: 16 rows per warp
  EXPECT_EQ(p.row_tiles, 7);        // 400 rows
  AttnPlan d = PlanPagedAttention(Decode(64, 4096, 64, 8), 132, big, 0, true);  // GQA 8:1
  EXPECT_EQ(d.rows_per_block, 16);  // decode: the four warps share 8 rows, split the tokens
  EXPECT_EQ(d.row_tiles, 1);
  for (KvDType t : {KvDType::kFp16, KvDType::kFp8E4M3, KvDType::kInt8, KvDType::kInt4}) {
    a.k_layout.dtype = a.v_layout.dtype = t;
    EXPECT_TRUE(PlanPagedAttention(a, 132, big, 0, true).tensor_cores);
  }
  a.k_layout.dtype = a.v_layout.dtype = KvDType::kFp32;  // stays SIMT
  EXPECT_FALSE(PlanPagedAttention(a, 132, big, 0, true).tensor_cores);
  a = Decode(2, 1000);
  a.head_dim = 256;  // stays SIMT
  AttnPlan wide = PlanPagedAttention(a, 132, big, 0, true);
  EXPECT_FALSE(wide.tensor_cores);
  EXPECT_EQ(wide.rows_per_block, 4);
  EXPECT_FALSE(PlanPagedAttention(Decode(2, 1000), 132, big).tensor_cores);  // off by default
}

TEST(AttentionPlanTest, UnsupportedShapesAreNamed) {
  EXPECT_STREQ(CheckAttentionShape(Decode(1, 10)), "");
  auto problem = [](AttnArgs a) { return std::string(CheckAttentionShape(a)); };
  AttnArgs a = Decode(1, 10);
  a.head_dim = 96;
  EXPECT_NE(problem(a).find("head_dim"), std::string::npos);
  a = Decode(1, 10, 30, 8);
  EXPECT_NE(problem(a).find("multiple of num_kv_heads"), std::string::npos);
  a = Decode(1, 10);
  a.block_size = 24;
  EXPECT_NE(problem(a).find("block_size"), std::string::npos);
  a = Decode(1, 10);
  a.v_layout.dtype = KvDType::kInt8;
  EXPECT_NE(problem(a).find("element type"), std::string::npos);
  a = Decode(1, 10);
  a.k_layout.dtype = a.v_layout.dtype = KvDType::kInt4;
  a.k_layout.granularity = KvGranularity::kPerGroup;
  a.k_layout.group_size = 4;
  a.k_layout.group_shift = 2;
  EXPECT_NE(problem(a).find("per-group"), std::string::npos);
  a = Decode(1, 10);
  a.max_context_len = 0;
  EXPECT_NE(problem(a).find("max_context_len"), std::string::npos);
  a = Decode(70000, 10);
  EXPECT_NE(problem(a).find("65535"), std::string::npos);
}

// The workspace the CUDA backend reserves at start-up (MaxPagedAttentionWorkspaceFloats) covers
// every step within the limits: each sequence count, each longest query that fits the token
// budget, contexts up to the limit on chunk boundaries and between them, on each kernel, with
// and without a workspace cap. And it is no more than twice what some step takes. The
// pipelined kernel as the backend reserves for it: the tensor cores' plan, and its own at the
// highest occupancy (4 blocks per SM here), its steps planned at their own (2 or 4).
TEST(AttentionPlanTest, ReservedWorkspaceCoversEveryStepWithinTheLimits) {
  const int max_seqs = 24, max_tokens = 600, max_context = 5000;
  std::vector<int> contexts = {1, 100, 255, 257, 4097, max_context};
  for (int c = kChunkTokens; c <= max_context; c += kChunkTokens) contexts.push_back(c);
  for (const std::string kernel : {"SIMT", "tensor cores", "pipelined"}) {
    const bool tensor_cores = kernel != "SIMT", pipelined = kernel == "pipelined";
    for (const size_t cap : {size_t{1} << 30, size_t{200000}}) {
      SCOPED_TRACE(kernel + ", cap " + std::to_string(cap));
      const AttnArgs limits = Decode(max_seqs, max_context);
      size_t reserved =
          MaxPagedAttentionWorkspaceFloats(limits, max_tokens, 132, cap, 0, tensor_cores);
      if (pipelined) {
        reserved = std::max(reserved, MaxPagedAttentionWorkspaceFloats(limits, max_tokens, 132, cap,
                                                                       4, true, true));
      }
      size_t most = 0;
      for (const KvDType dtype : {KvDType::kFp32, KvDType::kInt8}) {
        for (const int per_sm : {2, 4}) {
          if (per_sm == 4 && !pipelined) continue;
          for (int seqs = 1; seqs <= max_seqs; ++seqs) {
            for (int q = 1; q + seqs - 1 <= max_tokens; ++q) {
              for (int context : contexts) {
                AttnArgs a = Decode(seqs, context);
                a.max_query_len = q;
                a.k_layout.dtype = a.v_layout.dtype = dtype;
                a.k_layout.granularity = a.v_layout.granularity = KvGranularity::kPerToken;
                const int blocks = pipelined && PipelinedAttentionCovers(a) ? per_sm : 0;
                const size_t need = PlanPagedAttention(a, 132, cap, blocks, tensor_cores, pipelined)
                                        .workspace_floats;
                ASSERT_LE(need, reserved)
                    << seqs << " seqs, query " << q << ", context " << context;
                most = std::max(most, need);
              }
            }
          }
        }
      }
      EXPECT_GT(most, 0u);
      EXPECT_LE(reserved, 2 * most);
    }
  }
}

// What it comes to at a real model's limits on the H200 (132 SMs; the backend's default
// 256 MiB cap): Llama-3-8B's 32 query / 8 KV heads of 128, 8,192 tokens a step, 256
// sequences of up to 128K tokens. Printed for docs/PERF.md.
TEST(AttentionPlanTest, ReservedWorkspaceAtLlamaScale) {
  const size_t cap = (size_t{256} << 20) / sizeof(float);
  for (const bool tensor_cores : {false, true}) {
    const size_t floats =
        MaxPagedAttentionWorkspaceFloats(Decode(256, 131072), 8192, 132, cap, 0, tensor_cores);
    std::printf("Llama-3-8B limits, %s: %.1f MiB reserved\n",
                tensor_cores ? "tensor cores" : "SIMT", floats * 4.0 / 1048576.0);
    EXPECT_GT(floats, 0u);
    EXPECT_LE(floats, cap);
  }
}

// The pipelined kernel's split plan: one wave of num_sms × blocks-per-SM blocks (the batch
// alone may be more), splits of whole 64-token tiles and at least 256 tokens.
TEST(AttentionPlanTest, PipelinedSplitsFillOneWave) {
  const size_t big = size_t{1} << 30;
  // 1 × 64K, 8 KV heads, 2 blocks per SM: 264 / 8 = 33 splits, 32 tiles each: 32 of 2,048.
  AttnPlan p = PlanPagedAttention(Decode(1, 65536), 132, big, 2, false, true);
  ASSERT_TRUE(p.pipelined);
  EXPECT_EQ(p.rows_per_block, 8);
  EXPECT_EQ(p.row_tiles, 1);
  EXPECT_EQ(p.split_tokens % 64, 0);
  EXPECT_LE(int64_t{p.num_splits} * 8, 264);  // one wave
  EXPECT_GE(int64_t{p.num_splits} * 8, 240);  // and nearly a full one
  EXPECT_GE(int64_t{p.split_tokens} * p.num_splits, 65536);
  EXPECT_LT(int64_t{p.split_tokens} * (p.num_splits - 1), 65536);
  // 16 × 4K: 128 (sequence, KV head) pairs, 3 blocks per SM: 3 splits, 396 blocks.
  AttnPlan q = PlanPagedAttention(Decode(16, 4096), 132, big, 3, false, true);
  EXPECT_EQ(q.num_splits, 3);
  EXPECT_EQ(q.split_tokens, 1408);
  // 256 × 1K: the batch alone fills the GPU.
  EXPECT_EQ(PlanPagedAttention(Decode(256, 1024), 132, big, 3, false, true).num_splits, 1);
  // Short contexts split no finer than 256 tokens.
  EXPECT_EQ(PlanPagedAttention(Decode(1, 600), 132, big, 2, false, true).num_splits, 3);
  EXPECT_EQ(PlanPagedAttention(Decode(1, 200), 132, big, 2, false, true).num_splits, 1);
}

// Its shared memory, static and dynamic, against the opt-in limits of the GPUs it builds for:
// all of it fits sm_90's 227 KiB; 16-bit head_dim 256 (three 64 KiB stages) not sm_80's
// 163 KiB, while head_dim 128 fits sm_86 / sm_89's 99 KiB.
TEST(AttentionPlanTest, PipelinedSharedMemoryAgainstTheDevicesLimits) {
  for (const KvDType t :
       {KvDType::kFp16, KvDType::kBf16, KvDType::kFp8E4M3, KvDType::kInt8, KvDType::kInt4}) {
    for (const int hd : {64, 128, 256}) {
      EXPECT_LE(PipelinedSharedBytes(t, hd), 227 << 10) << static_cast<int>(t) << " " << hd;
      EXPECT_GT(PipelinedSharedBytes(t, hd), 32 << 10);
    }
    EXPECT_LE(PipelinedSharedBytes(t, 128), 99 << 10);
  }
  EXPECT_GT(PipelinedSharedBytes(KvDType::kBf16, 256), 163 << 10);
}

// Where the pipelined kernel does not cover a step (more than 8 rows per KV head, per-group or
// per-channel parameters, float32), the plan falls back to tensor cores, or SIMT.
TEST(AttentionPlanTest, PipelinedFallsBackWhereItDoesNotCover) {
  AttnArgs a;
  a.num_seqs = 2;
  a.num_heads = 8;
  a.num_kv_heads = 2;
  a.head_dim = 128;
  a.block_size = 16;
  a.max_query_len = 1;
  a.max_context_len = 4096;
  a.k_layout.dtype = a.v_layout.dtype = KvDType::kInt8;
  a.k_layout.granularity = a.v_layout.granularity = KvGranularity::kPerToken;
  EXPECT_TRUE(PlanPagedAttention(a, 132, 1 << 28, 0, false, true).pipelined);
  a.max_query_len = 3;  // 12 rows
  AttnPlan p = PlanPagedAttention(a, 132, 1 << 28, 0, false, true);
  EXPECT_FALSE(p.pipelined);
  EXPECT_TRUE(p.tensor_cores);
  a.max_query_len = 1;
  a.k_layout.granularity = KvGranularity::kPerChannel;
  EXPECT_FALSE(PlanPagedAttention(a, 132, 1 << 28, 0, false, true).pipelined);
  a.k_layout.dtype = a.v_layout.dtype = KvDType::kFp32;
  p = PlanPagedAttention(a, 132, 1 << 28, 0, false, true);
  EXPECT_FALSE(p.pipelined || p.tensor_cores);
}

}  // namespace
}  // namespace kvserve::kernels::cuda
