// The CPU backend's ops against straightforward formulas: paged attention over scattered
// blocks equals dense causal attention, RoPE rotates pairs, RMSNorm with fused residual.
#include <cmath>
#include <random>

#include "common/model/hf_config.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/rope.h"

namespace kvserve::kernels {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(CpuBackendTest, PagedAttentionEqualsDenseCausalAttention) {
  auto be = CreateCpuBackend({});
  std::mt19937 rng(3);
  const int heads = 4, kv_heads = 2, d = 8, bs = 4, blocks = 16, ctx = 13, qlen = 5;
  std::vector<float> k_cache(blocks * kv_heads * bs * d), v_cache(k_cache.size());
  std::vector<int32_t> table = {9, 2, 14, 5};  // scattered
  std::vector<float> keys = Random(ctx * kv_heads * d, rng),
                     values = Random(ctx * kv_heads * d, rng);
  std::vector<int64_t> slots;
  for (int t = 0; t < ctx; ++t) slots.push_back(int64_t{table[t / bs]} * bs + t % bs);
  KvCacheView cache;
  cache.k = reinterpret_cast<uint8_t*>(k_cache.data());
  cache.v = reinterpret_cast<uint8_t*>(v_cache.data());
  cache.num_blocks = blocks;
  cache.num_kv_heads = kv_heads;
  cache.block_size = bs;
  cache.head_dim = d;
  be->WriteKv({keys.data(), values.data(), kv_heads * d, slots.data(), ctx, cache});
  std::vector<float> q = Random(qlen * heads * d, rng), out(qlen * heads * d);
  int32_t qs = 0, ql = qlen, cl = ctx;
  PagedAttentionParams p;
  p.q = q.data();
  p.q_stride = heads * d;
  p.out = out.data();
  p.cache = cache;
  p.query_start = &qs;
  p.query_len = &ql;
  p.context_len = &cl;
  p.block_tables = table.data();
  p.num_seqs = 1;
  p.max_blocks_per_seq = 4;
  p.num_heads = heads;
  p.scale = 0.3f;
  be->PagedAttention(p);
  for (int j = 0; j < qlen; ++j) {
    const int pos = ctx - qlen + j;
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / (heads / kv_heads);
      std::vector<double> w(pos + 1);
      double mx = -1e30, sum = 0;
      for (int t = 0; t <= pos; ++t) {
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += q[(j * heads + h) * d + i] * keys[(t * kv_heads + kvh) * d + i];
        w[t] = dot * 0.3;
        mx = std::max(mx, w[t]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int i = 0; i < d; ++i) {
        double o = 0;
        for (int t = 0; t <= pos; ++t) o += w[t] / sum * values[(t * kv_heads + kvh) * d + i];
        EXPECT_NEAR(out[(j * heads + h) * d + i], o, 1e-5);
      }
    }
  }
  // Written as fp16 for the O projection (out16): the float output rounded.
  std::vector<uint16_t> out16(out.size());
  p.out = nullptr;
  p.out16 = out16.data();
  p.out16_type = DType::kF16;
  be->PagedAttention(p);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out16[i], FloatToF16(out[i])) << i;
}

TEST(CpuBackendTest, RmsNormWithFusedResidual) {
  auto be = CreateCpuBackend({});
  std::vector<float> x = {1, 2, 3, 4}, res = {1, 1, 1, 1}, w = {1, 1, 2, 2}, out(4);
  be->RmsNorm({x.data(), res.data(), w.data(), out.data(), 1, 4, 0.0f});
  EXPECT_EQ(res, (std::vector<float>{2, 3, 4, 5}));
  const double rms = std::sqrt((4 + 9 + 16 + 25) / 4.0);
  EXPECT_NEAR(out[0], 2 / rms, 1e-6);
  EXPECT_NEAR(out[3], 2 * 5 / rms, 1e-6);
}

// Grouped rows (the per-head q / k norms of Qwen3 over whole qkv rows) equal row-by-row norms
// at the same offsets, and leave everything between the groups alone.
TEST(CpuBackendTest, RmsNormOverGroupsOfRows) {
  auto be = CreateCpuBackend({});
  std::mt19937 rng(9);
  const int64_t tokens = 5, heads = 3, d = 8, stride = heads * d + 16;
  std::vector<float> x = Random(tokens * stride, rng), w = Random(d, rng);
  std::vector<float> grouped = x, each = x;
  be->RmsNorm(
      {grouped.data(), nullptr, w.data(), grouped.data(), tokens * heads, d, 1e-5f, heads, stride});
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = each.data() + t * stride;
    be->RmsNorm({row, nullptr, w.data(), row, heads, d, 1e-5f});
  }
  EXPECT_EQ(grouped, each);
  for (int64_t t = 0; t < tokens; ++t)
    EXPECT_EQ(grouped[t * stride + heads * d], x[t * stride + heads * d]);
}

// RMSNorm and SiLU·mul writing fp16 / bf16 (out16) give the float outputs rounded, and a Gemm
// given those (x16) gives bit for bit what it gives when it rounds x itself: the model's
// 16-bit path changes no result.
TEST(CpuBackendTest, SixteenBitActivationsFeedTheGemmUnchanged) {
  auto be = CreateCpuBackend({});
  std::mt19937 rng(5);
  const int64_t rows = 3, hidden = 40, inter = 24;
  const std::vector<float> x = Random(rows * hidden, rng), res = Random(rows * hidden, rng),
                           w = Random(hidden, rng), gate_up = Random(rows * 2 * inter, rng);
  const std::vector<float> wf = Random(inter * hidden, rng);
  for (const DType type : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(type));
    auto round = [&](float v) { return type == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v); };
    std::vector<uint16_t> weight16(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) weight16[i] = round(wf[i]);

    std::vector<float> res_f = res, res_16 = res, norm(rows * hidden);
    std::vector<uint16_t> norm16(rows * hidden);
    be->RmsNorm({x.data(), res_f.data(), w.data(), norm.data(), rows, hidden, 1e-5f});
    be->RmsNorm({.x = x.data(),
                 .residual = res_16.data(),
                 .weight = w.data(),
                 .rows = rows,
                 .hidden = hidden,
                 .eps = 1e-5f,
                 .out16 = norm16.data(),
                 .out16_type = type});
    EXPECT_EQ(res_16, res_f);
    for (size_t i = 0; i < norm.size(); ++i) ASSERT_EQ(norm16[i], round(norm[i])) << i;

    std::vector<float> act(rows * inter);
    std::vector<uint16_t> act16(rows * inter);
    be->SiluMul({gate_up.data(), act.data(), rows, inter});
    be->SiluMul({.gate_up = gate_up.data(),
                 .num_tokens = rows,
                 .inter = inter,
                 .out16 = act16.data(),
                 .out16_type = type});
    for (size_t i = 0; i < act.size(); ++i) ASSERT_EQ(act16[i], round(act[i])) << i;

    std::vector<float> y(rows * inter), y16(rows * inter);
    be->Gemm({norm.data(), weight16.data(), nullptr, y.data(), rows, inter, hidden, type});
    be->Gemm({.w = weight16.data(),
              .y = y16.data(),
              .m = rows,
              .n = inter,
              .k = hidden,
              .w_type = type,
              .x16 = norm16.data()});
    EXPECT_EQ(y16, y);
  }
}

TEST(CpuBackendTest, EmbeddingWidens16BitTables) {
  auto be = CreateCpuBackend({});
  const std::vector<uint16_t> bf16 = {FloatToBf16(1.5f), FloatToBf16(-2.0f), FloatToBf16(0.25f),
                                      FloatToBf16(3.0f)};
  const std::vector<uint16_t> f16 = {FloatToF16(1.5f), FloatToF16(-2.0f), FloatToF16(0.25f),
                                     FloatToF16(3.0f)};
  const std::vector<int32_t> ids = {1, 0};
  std::vector<float> out(4);
  be->Embedding({ids.data(), bf16.data(), out.data(), 2, 2, DType::kBF16});
  EXPECT_EQ(out, (std::vector<float>{0.25f, 3.0f, 1.5f, -2.0f}));
  be->Embedding({ids.data(), f16.data(), out.data(), 2, 2, DType::kF16});
  EXPECT_EQ(out, (std::vector<float>{0.25f, 3.0f, 1.5f, -2.0f}));
}

TEST(CpuBackendTest, RopeRotatesHalfPairs) {
  auto be = CreateCpuBackend({});
  std::vector<float> x = {1, 0, 0, 1};  // head_dim 4: pairs (x0, x2), (x1, x3)
  std::vector<float> inv = {1.0f, 0.5f};
  int32_t pos = 2;
  be->Rope({x.data(), &pos, inv.data(), 1, 1, 4, 4});
  EXPECT_NEAR(x[0], std::cos(2.0), 1e-6);
  EXPECT_NEAR(x[2], std::sin(2.0), 1e-6);
  EXPECT_NEAR(x[1], -std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[3], std::cos(1.0), 1e-6);
}

TEST(RopeTest, Llama3ScalingKeepsHighAndScalesLowFrequencies) {
  RopeConfig rope;
  rope.type = "llama3";
  rope.theta = 500000;
  rope.factor = 8;
  rope.original_max_position_embeddings = 8192;
  std::vector<float> plain = RopeInvFreq(RopeConfig{.theta = 500000}, 128);
  std::vector<float> scaled = RopeInvFreq(rope, 128);
  EXPECT_EQ(scaled[0], plain[0]);                 // wavelength 2π: kept
  EXPECT_NEAR(scaled[63], plain[63] / 8, 1e-12);  // longest wavelength: / factor
  EXPECT_LT(scaled[45], plain[45]);
  RopeConfig linear{.type = "linear", .theta = 10000, .factor = 2};
  EXPECT_NEAR(RopeInvFreq(linear, 8)[1], RopeInvFreq(RopeConfig{}, 8)[1] / 2, 1e-9);
}

TEST(CpuBackendTest, CopyBlocksCopiesKAndV) {
  auto be = CreateCpuBackend({});
  std::vector<float> k(3 * 2 * 4), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i);
  KvCacheView view;
  view.k = reinterpret_cast<uint8_t*>(k.data());
  view.v = reinterpret_cast<uint8_t*>(v.data());
  view.num_blocks = 3;
  view.num_kv_heads = 1;
  view.block_size = 2;
  view.head_dim = 4;
  int32_t src = 0, dst = 2;
  be->CopyBlocks({&view, &view, 1, &src, &dst, 1});
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(k[16 + i], i);
    EXPECT_EQ(v[16 + i], i);
  }
}

}  // namespace
}  // namespace kvserve::kernels
