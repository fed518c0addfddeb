// Conformance of every CUDA backend op with its CPU twin (the reference backend) on fresh
// random inputs, with device outputs poisoned (NaN) before each op: GEMMs (float32, fp16 and
// bf16 weights), embedding, RMSNorm with and without the fused residual, RoPE, SiLU-gated
// activation, the KV write in every format (bit-identical codes and scales), paged attention
// for every format over mixed prefill / decode batches, GQA groups, split-KV lengths, block
// sizes and head sizes, block copies (device ↔ device ↔ pinned host), and sampling (the same
// token as the CPU twin, for every parameter mix, on tie-heavy and vocabulary-sliced rows).
// Graphs are cuda_backend_graphs_test.cc's, DecodeGemv decode_gemv_test.cc's (the same binary).
// Skipped without a CUDA device. Label: gpu.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/kv/kv_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/nccl_communicator.h"
#include "kernels/fingerprint.h"
#include "tests/gpu/cuda_backend_fixture.h"
#include "tests/gpu/dev_buffer.h"
#include "tests/kernels/attention_cases.h"
#include "tests/kernels/sampling_cases.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

TEST_F(CudaBackendTest, GemmMatchesCpuForEveryWeightType) {
  const int64_t m = 37, n = 301, k = 264;
  for (DType wt : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(wt)));
    std::vector<float> x = Random(m * k, rng_), w = Random(n * k, rng_, 0.05f),
                       bias = Random(n, rng_);
    std::vector<uint16_t> w16(n * k);
    std::vector<float> x_ref = x;  // the GPU rounds x to the weights' type for the tensor cores
    if (wt != DType::kF32) {
      for (int64_t i = 0; i < n * k; ++i)
        w16[i] = wt == DType::kF16 ? FloatToF16(w[i]) : FloatToBf16(w[i]);
      for (float& v : x_ref)
        v = wt == DType::kF16 ? F16ToFloat(FloatToF16(v)) : Bf16ToFloat(FloatToBf16(v));
    }
    std::vector<float> want(m * n);
    const void* w_host = wt == DType::kF32 ? static_cast<const void*>(w.data()) : w16.data();
    cpu_->Gemm({x_ref.data(), w_host, bias.data(), want.data(), m, n, k, wt});
    Dev<float> dx(x), dbias(bias), dy(m * n), dw(w);
    Dev<uint16_t> dw16(w16);
    const void* w_dev = wt == DType::kF32 ? static_cast<const void*>(dw.get()) : dw16.get();
    gpu_->Gemm({dx.get(), w_dev, dbias.get(), dy.get(), m, n, k, wt});
    EXPECT_LE(WorstRatio(dy.Host(), want, 1e-4, 1e-4), 1.0);
  }
}

TEST_F(CudaBackendTest, RowOpsMatchCpu) {
  const int64_t tokens = 9, hidden = 4096 + 64, vocab = 50, heads = 6, d = 128, inter = 1000;
  // Embedding.
  std::vector<float> table = Random(vocab * hidden, rng_);
  std::vector<int32_t> ids = {3, 0, 49, 3, 17, 8, 8, 22, 1};
  std::vector<float> emb(tokens * hidden);
  cpu_->Embedding({ids.data(), table.data(), emb.data(), tokens, hidden});
  Dev<int32_t> dids(ids);
  Dev<float> dtable(table), demb(tokens * hidden);
  gpu_->Embedding({dids.get(), dtable.get(), demb.get(), tokens, hidden});
  EXPECT_EQ(demb.Host(), emb);

  // RMSNorm, plain and with the fused residual (in place).
  std::vector<float> x = Random(tokens * hidden, rng_), res = Random(tokens * hidden, rng_),
                     weight = Random(hidden, rng_);
  std::vector<float> plain(tokens * hidden), x2 = x, res2 = res;
  cpu_->RmsNorm({x.data(), nullptr, weight.data(), plain.data(), tokens, hidden, 1e-5f});
  cpu_->RmsNorm({x2.data(), res2.data(), weight.data(), x2.data(), tokens, hidden, 1e-5f});
  Dev<float> dx(x), dres(res), dw(weight), dplain(tokens * hidden);
  gpu_->RmsNorm({dx.get(), nullptr, dw.get(), dplain.get(), tokens, hidden, 1e-5f});
  EXPECT_LE(WorstRatio(dplain.Host(), plain, 1e-5, 1e-5), 1.0);
  gpu_->RmsNorm({dx.get(), dres.get(), dw.get(), dx.get(), tokens, hidden, 1e-5f});
  EXPECT_LE(WorstRatio(dx.Host(), x2, 1e-5, 1e-5), 1.0);
  EXPECT_LE(WorstRatio(dres.Host(), res2, 1e-6, 1e-6), 1.0);

  // Embedding from a bf16 table; RMSNorm over groups of rows (Qwen3's per-head q norm).
  std::vector<uint16_t> table16(table.size());
  for (size_t i = 0; i < table.size(); ++i) table16[i] = FloatToBf16(table[i]);
  cpu_->Embedding({ids.data(), table16.data(), emb.data(), tokens, hidden, DType::kBF16});
  Dev<uint16_t> dtable16(table16);
  gpu_->Embedding({dids.get(), dtable16.get(), demb.get(), tokens, hidden, DType::kBF16});
  EXPECT_EQ(demb.Host(), emb);
  const int64_t group_stride = heads * d + 2 * d;
  std::vector<float> qkv = Random(tokens * group_stride, rng_), qw = Random(d, rng_);
  std::vector<float> qkv_cpu = qkv;
  cpu_->RmsNorm({qkv_cpu.data(), nullptr, qw.data(), qkv_cpu.data(), tokens * heads, d, 1e-6f,
                 heads, group_stride});
  Dev<float> dqkv(qkv), dqw(qw);
  gpu_->RmsNorm(
      {dqkv.get(), nullptr, dqw.get(), dqkv.get(), tokens * heads, d, 1e-6f, heads, group_stride});
  EXPECT_LE(WorstRatio(dqkv.Host(), qkv_cpu, 1e-5, 1e-5), 1.0);

  // RoPE on a strided row (q heads of a qkv row), llama3-scaled frequencies included.
  const int64_t stride = heads * d + 2 * d;
  std::vector<float> rows = Random(tokens * stride, rng_), inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i)
    inv_freq[i] = std::pow(500000.0f, -2.0f * i / d) / (i > 40 ? 8.0f : 1.0f);
  std::vector<int32_t> pos = {0, 1, 2, 700, 8191, 12, 13, 100000, 5};
  std::vector<float> rows_cpu = rows;
  cpu_->Rope({rows_cpu.data(), pos.data(), inv_freq.data(), tokens, heads, d, stride});
  Dev<float> drows(rows), dfreq(inv_freq);
  Dev<int32_t> dpos(pos);
  gpu_->Rope({drows.get(), dpos.get(), dfreq.get(), tokens, heads, d, stride});
  EXPECT_LE(WorstRatio(drows.Host(), rows_cpu, 2e-4, 2e-4), 1.0);

  // SiLU-gated activation.
  std::vector<float> gate_up = Random(tokens * 2 * inter, rng_, 3.0f), act(tokens * inter);
  cpu_->SiluMul({gate_up.data(), act.data(), tokens, inter});
  Dev<float> dgu(gate_up), dact(tokens * inter);
  gpu_->SiluMul({dgu.get(), dact.get(), tokens, inter});
  EXPECT_LE(WorstRatio(dact.Host(), act, 1e-6, 1e-5), 1.0);
}

// RMSNorm and SiLU·mul writing fp16 / bf16 (out16) give bit for bit the device's float outputs
// rounded, and a Gemm given them (x16) gives bit for bit what it gives when it rounds x itself.
TEST_F(CudaBackendTest, SixteenBitActivationsFeedTheGemmUnchanged) {
  const int64_t rows = 5, hidden = 2048 + 64, inter = 1000;
  const std::vector<float> x = Random(rows * hidden, rng_), res = Random(rows * hidden, rng_),
                           weight = Random(hidden, rng_),
                           gate_up = Random(rows * 2 * inter, rng_, 3.0f),
                           w = Random(inter * hidden, rng_, 0.05f);
  for (const DType type : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(type)));
    auto round = [&](float v) { return type == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v); };
    std::vector<uint16_t> w16(w.size());
    for (size_t i = 0; i < w.size(); ++i) w16[i] = round(w[i]);
    Dev<float> dx(x), dres(res), dres16(res), dweight(weight), dgu(gate_up);
    Dev<float> dnorm(rows * hidden), dact(rows * inter), dy(rows * inter), dy16(rows * inter);
    Dev<uint16_t> dnorm16(rows * hidden), dact16(rows * inter), dw16(w16);
    gpu_->RmsNorm({dx.get(), dres.get(), dweight.get(), dnorm.get(), rows, hidden, 1e-5f});
    gpu_->RmsNorm({.x = dx.get(),
                   .residual = dres16.get(),
                   .weight = dweight.get(),
                   .rows = rows,
                   .hidden = hidden,
                   .eps = 1e-5f,
                   .out16 = dnorm16.get(),
                   .out16_type = type});
    gpu_->SiluMul({dgu.get(), dact.get(), rows, inter});
    gpu_->SiluMul({.gate_up = dgu.get(),
                   .num_tokens = rows,
                   .inter = inter,
                   .out16 = dact16.get(),
                   .out16_type = type});
    gpu_->Gemm({dnorm.get(), dw16.get(), nullptr, dy.get(), rows, inter, hidden, type});
    gpu_->Gemm({.w = dw16.get(),
                .y = dy16.get(),
                .m = rows,
                .n = inter,
                .k = hidden,
                .w_type = type,
                .x16 = dnorm16.get()});
    Sync();
    const std::vector<float> norm = dnorm.Host(), act = dact.Host();
    const std::vector<uint16_t> norm16 = dnorm16.Host(), act16 = dact16.Host();
    for (size_t i = 0; i < norm.size(); ++i) ASSERT_EQ(norm16[i], round(norm[i])) << i;
    for (size_t i = 0; i < act.size(); ++i) ASSERT_EQ(act16[i], round(act[i])) << i;
    EXPECT_EQ(dres16.Host(), dres.Host());
    EXPECT_EQ(dy16.Host(), dy.Host());
  }
}

// The device twin of a Pool.
struct DevPool {
  explicit DevPool(const Pool& p) : k(p.k), v(p.v), ks(p.ks), vs(p.vs), view(p.view) {
    view.k = k.get();
    view.v = v.get();
    view.k_scales = view.k_format.quantized() ? ks.get() : nullptr;
    view.v_scales = view.v_format.quantized() ? vs.get() : nullptr;
  }
  Dev<uint8_t> k, v;
  Dev<uint16_t> ks, vs;
  KvCacheView view;
};

// Writes every sequence's whole context through the CPU backend and the GPU backend (prefix
// tokens first as one write, then the query tokens), then runs attention on both (unless
// `attention` is false: the KV write's codes and scales only).
// `replay`: the attention is also recorded into a CUDA graph and replayed twice, each replay
// giving the eager output bit for bit (what a kernel keeps between launches, such as the
// pipelined kernel's merge counters, must be left as it found it).
void CheckFormatOnShape(Backend& cpu, Backend& gpu, const FormatCase& fc, const Shape& s,
                        std::mt19937& rng, double atol = 2e-5, double rtol = 2e-4,
                        bool attention = true, bool replay = false) {
  SCOPED_TRACE(Describe(fc, s));
  // Scattered blocks: a shuffled pool, so no sequence reads consecutive blocks.
  const BatchLayout layout = LayOut(s, rng);
  const int64_t num_seqs = layout.num_seqs, max_blocks = layout.max_blocks,
                max_q = layout.max_query, max_ctx = layout.max_context;
  const std::vector<int32_t>& tables = layout.tables;
  Pool pool(fc.k, fc.v, layout.pool_blocks, s.kv_heads, s.bs, s.d);
  const int64_t kv_dim = s.kv_heads * s.d, row = (s.heads + 2 * s.kv_heads) * s.d;
  auto slots_of = [&](int64_t i, int64_t from, int64_t to) {
    std::vector<int64_t> slots;
    for (int64_t t = from; t < to; ++t) slots.push_back(layout.Slot(s, i, t));
    return slots;
  };
  // Phase 1: prefixes (one write per sequence, all of them on both backends).
  DevPool dev(pool);
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<float> qkv;
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < num_seqs; ++i) {
      const int64_t from = phase == 0 ? 0 : s.seqs[i].prefix;
      const int64_t to = phase == 0 ? s.seqs[i].prefix : s.seqs[i].prefix + s.seqs[i].query;
      std::vector<int64_t> sl = slots_of(i, from, to);
      slots.insert(slots.end(), sl.begin(), sl.end());
      std::vector<float> rows = Random((to - from) * row, rng);
      qkv.insert(qkv.end(), rows.begin(), rows.end());
    }
    const int64_t n = static_cast<int64_t>(slots.size());
    if (n == 0) continue;
    const int64_t q_dim = s.heads * s.d;
    cpu.WriteKv(
        {qkv.data() + q_dim, qkv.data() + q_dim + kv_dim, row, slots.data(), n, pool.Host()});
    Dev<float> dqkv(qkv);
    Dev<int64_t> dslots(slots);
    gpu.WriteKv({dqkv.get() + q_dim, dqkv.get() + q_dim + kv_dim, row, dslots.get(), n, dev.view});
    if (phase == 0) continue;
    EXPECT_EQ(dev.k.Host(), pool.k) << "K codes differ";
    EXPECT_EQ(dev.v.Host(), pool.v) << "V codes differ";
    if (fc.k.quantized()) {
      EXPECT_EQ(dev.ks.Host(), pool.ks) << "K scales differ";
    }
    if (fc.v.quantized()) {
      EXPECT_EQ(dev.vs.Host(), pool.vs) << "V scales differ";
    }
    if (!attention) continue;

    // Attention of the query tokens over prefix + query.
    std::vector<int32_t> qstart, qlen, ctx;
    int32_t at = 0;
    for (const SeqSpec& q : s.seqs) {
      qstart.push_back(at);
      qlen.push_back(q.query);
      ctx.push_back(q.prefix + q.query);
      at += q.query;
    }
    PagedAttentionParams p;
    p.q_stride = row;
    p.num_seqs = num_seqs;
    p.max_blocks_per_seq = max_blocks;
    p.num_heads = s.heads;
    p.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
    p.max_query_len = max_q;
    p.max_context_len = max_ctx;
    std::vector<float> want(n * q_dim);
    p.q = qkv.data();
    p.out = want.data();
    p.cache = pool.Host();
    p.query_start = qstart.data();
    p.query_len = qlen.data();
    p.context_len = ctx.data();
    p.block_tables = tables.data();
    cpu.PagedAttention(p);
    Dev<int32_t> dqs(qstart), dql(qlen), dctx(ctx), dtab(tables);
    Dev<float> dout(n * q_dim);
    p.q = dqkv.get();
    p.out = dout.get();
    p.cache = dev.view;
    p.query_start = dqs.get();
    p.query_len = dql.get();
    p.context_len = dctx.get();
    p.block_tables = dtab.get();
    gpu.PagedAttention(p);
    const std::vector<float> got = dout.Host();
    EXPECT_LE(WorstRatio(got, want, atol, rtol), 1.0) << "attention output differs";
    // Written as bf16 for the O projection (out16): the float output rounded, bit for bit.
    Dev<uint16_t> dout16(n * q_dim);
    p.out = nullptr;
    p.out16 = dout16.get();
    p.out16_type = DType::kBF16;
    gpu.PagedAttention(p);
    const std::vector<uint16_t> got16 = dout16.Host();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got16[i], FloatToBf16(got[i])) << "bf16 output " << i;
    }
    if (!replay) continue;
    p.out = dout.get();
    p.out16 = nullptr;
    ASSERT_OK(gpu.BeginGraph());
    gpu.PagedAttention(p);
    ASSERT_OK_AND_ASSIGN(const int64_t graph, gpu.EndGraph());
    const std::vector<float> nan(got.size(), std::nanf(""));
    for (int round = 0; round < 2; ++round) {
      gpu.Upload(dout.get(), nan.data(), sizeof(float) * nan.size());
      ASSERT_TRUE(gpu.ReplayGraph(graph));
      const std::vector<float> replayed = dout.Host();
      ASSERT_EQ(0, std::memcmp(replayed.data(), got.data(), sizeof(float) * got.size()))
          << "replay " << round << " differs from the eager run";
    }
    gpu.DropGraphs();
  }
}

// Emulated on fewer heads and shorter contexts (still split into several chunks, still prefill
// chunks over cached prefixes): 66 checks of the full shapes took 3 minutes of CI there.
TEST_F(CudaBackendTest, KvWriteAndPagedAttentionMatchCpuForEveryFormat) {
#ifdef KVSERVE_CUDA_EMULATED
  const std::vector<Shape> shapes = {
      {8, 2, 128, 16, {{0, 1}, {700, 1}, {1100, 1}, {15, 1}}},
      {16, 2, 64, 8, {{0, 37}, {120, 40}, {600, 1}, {5, 3}}},
      {4, 4, 256, 32, {{90, 17}, {600, 1}}},
  };
#else
  const std::vector<Shape> shapes = {
      // Decode batch with split-KV lengths (several chunks), GQA 4:1, block 16.
      {32, 8, 128, 16, {{0, 1}, {700, 1}, {4000, 1}, {15, 1}, {1023, 1}}},
      // Mixed prefill chunks over cached prefixes and decodes, GQA 8:1 (8 rows per block).
      {16, 2, 64, 8, {{0, 37}, {300, 100}, {1000, 1}, {5, 3}}},
      // Multi-head attention (no grouping), head_dim 256, block 32.
      {4, 4, 256, 32, {{90, 17}, {600, 1}}},
  };
#endif
  // No workspace: one thread block walks a whole context, folding chunks by online softmax.
  ASSERT_OK_AND_ASSIGN(auto unsplit, CreateCudaBackend({.max_attention_workspace_bytes = 0}));
  for (const FormatCase& fc : Formats()) {
    for (const Shape& s : shapes) {
      CheckFormatOnShape(*cpu_, *gpu_, fc, s, rng_);
      CheckFormatOnShape(*cpu_, *unsplit, fc, s, rng_);
    }
  }
}

// The KV write alone, on small shapes (head_dim 64 / 128 / 256): quick enough to run again in
// the emulator's other thread orders (tests/CMakeLists.txt), where a missing barrier between
// the write's phases (values, per-group parameters, codes) gives different codes.
TEST_F(CudaBackendTest, KvWriteMatchesCpuForEveryFormat) {
  const std::vector<Shape> shapes = {
      {8, 2, 128, 16, {{0, 21}, {40, 2}}},
      {4, 4, 64, 8, {{9, 5}}},
      {2, 1, 256, 32, {{3, 4}}},
  };
  for (const FormatCase& fc : Formats()) {
    for (const Shape& s : shapes) {
      CheckFormatOnShape(*cpu_, *gpu_, fc, s, rng_, 0, 0, /*attention=*/false);
    }
  }
}

// The KV write with RoPE fused (one launch) gives what Rope on q and k, then the KV write, give:
// the same cache bytes and the same rotated queries, bit for bit, on each backend, for every
// format (per-channel runs read other tokens' K while they are written: never rotated in place).
// On the GPU the two paths share the unfused rotation arithmetic.
TEST_F(CudaBackendTest, KvWriteWithRopeIsRopeThenKvWrite) {
  const std::vector<Shape> shapes = {
      {8, 2, 128, 16, {{0, 21}, {0, 2}}},
      {4, 4, 64, 8, {{0, 14}}},
      {2, 1, 256, 32, {{0, 7}}},
  };
  for (const FormatCase& fc : Formats()) {
    for (const Shape& s : shapes) {
      SCOPED_TRACE(Describe(fc, s));
      const BatchLayout layout = LayOut(s, rng_);
      const int64_t q_dim = int64_t{s.heads} * s.d, kv_dim = int64_t{s.kv_heads} * s.d;
      const int64_t row = q_dim + 2 * kv_dim;
      std::vector<int64_t> slots;
      std::vector<int32_t> positions;
      for (int64_t i = 0; i < layout.num_seqs; ++i) {
        for (int64_t t = 0; t < s.seqs[i].query; ++t) {
          slots.push_back(layout.Slot(s, i, t));
          positions.push_back(static_cast<int32_t>(37 * t + 5 * i));  // varied angles
        }
      }
      const int64_t n = static_cast<int64_t>(slots.size());
      const std::vector<float> qkv = Random(n * row, rng_);
      std::vector<float> inv_freq(s.d / 2);
      for (int64_t i = 0; i < s.d / 2; ++i) {
        inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(s.d));
      }
      for (Backend* b : {cpu_.get(), gpu_.get()}) {
        const bool on_gpu = b == gpu_.get();
        SCOPED_TRACE(on_gpu ? "cuda" : "cpu");
        Pool unfused(fc.k, fc.v, layout.pool_blocks, s.kv_heads, s.bs, s.d);
        Pool fused = unfused;
        DevPool dev_unfused(unfused), dev_fused(fused);
        Dev<float> d_a(qkv), d_b(qkv), d_inv(inv_freq);
        Dev<int32_t> d_pos(positions);
        Dev<int64_t> d_slots(slots);
        std::vector<float> a = qkv, bq = qkv;
        float* xa = on_gpu ? d_a.get() : a.data();
        float* xb = on_gpu ? d_b.get() : bq.data();
        const int32_t* pos = on_gpu ? d_pos.get() : positions.data();
        const float* inv = on_gpu ? d_inv.get() : inv_freq.data();
        const int64_t* sl = on_gpu ? d_slots.get() : slots.data();
        const RopeParams rope{xa, pos, inv, n, s.heads + s.kv_heads, s.d, row};
        b->Rope(rope);
        b->WriteKv({xa + q_dim, xa + q_dim + kv_dim, row, sl, n,
                    on_gpu ? dev_unfused.view : unfused.Host()});
        b->WriteKv({.k = xb + q_dim,
                    .v = xb + q_dim + kv_dim,
                    .row_stride = row,
                    .slot_mapping = sl,
                    .num_tokens = n,
                    .cache = on_gpu ? dev_fused.view : fused.Host(),
                    .rope = {xb, pos, inv, n, s.heads, s.d, row}});
        if (on_gpu) {
          a = d_a.Host();
          bq = d_b.Host();
          EXPECT_EQ(dev_fused.k.Host(), dev_unfused.k.Host()) << "K codes differ";
          EXPECT_EQ(dev_fused.v.Host(), dev_unfused.v.Host()) << "V codes differ";
          if (fc.k.quantized()) EXPECT_EQ(dev_fused.ks.Host(), dev_unfused.ks.Host());
        } else {
          EXPECT_EQ(fused.k, unfused.k) << "K codes differ";
          EXPECT_EQ(fused.v, unfused.v) << "V codes differ";
          if (fc.k.quantized()) EXPECT_EQ(fused.ks, unfused.ks);
        }
        for (int64_t t = 0; t < n; ++t) {
          ASSERT_EQ(0, std::memcmp(a.data() + t * row, bq.data() + t * row, sizeof(float) * q_dim))
              << "token " << t << ": the rotated queries differ";
        }
      }
    }
  }
}

// The tensor-core kernel (fp16 / bf16 / quantized caches at head_dim 64 and 128; the rest
// stays SIMT), with the looser tolerances of its 16-bit operands (TensorCoreTolerance). The
// CPU emulation (tests/kernels/attention_emulation_test.cc) runs smaller cases in CI.
TEST_F(CudaBackendTest, TensorCoreAttentionMatchesCpuForEveryFormat) {
  const std::vector<Shape> shapes = {
      {32, 8, 128, 16, {{0, 1}, {700, 1}, {4000, 1}, {15, 1}, {1023, 1}}},
      {16, 2, 64, 8, {{0, 37}, {300, 100}, {1000, 1}, {5, 3}}},
      // GQA 8:1: 16 rows (one warp-tile, decode style) next to 72 (prefill style) in one launch.
      {64, 8, 128, 32, {{3000, 2}, {17, 1}, {255, 9}}},
      // Prefill chunks of 320 and 256 rows. (A 300-token chunk over 2,000 cached, 1,200 rows,
      // made the CPU reference take over 358 s on the GPU machine; this one is ~9x cheaper.)
      {32, 8, 128, 16, {{500, 80}, {0, 64}}},
  };
  ASSERT_OK_AND_ASSIGN(auto split, CreateCudaBackend({.attention_tensor_cores = true}));
  ASSERT_OK_AND_ASSIGN(auto unsplit, CreateCudaBackend({.max_attention_workspace_bytes = 0,
                                                        .attention_tensor_cores = true}));
  // The loop that loads each step's K during the step before.
  ASSERT_OK_AND_ASSIGN(auto prefetch, CreateCudaBackend({.attention_tensor_cores = true,
                                                         .attention_prefetch_k = true}));
  for (const FormatCase& fc : Formats()) {
    const Tolerance tol = TensorCoreTolerance(fc.k.dtype);
    for (const Shape& s : shapes) {
      CheckFormatOnShape(*cpu_, *split, fc, s, rng_, tol.atol, tol.rtol);
      CheckFormatOnShape(*cpu_, *unsplit, fc, s, rng_, tol.atol, tol.rtol);
      CheckFormatOnShape(*cpu_, *prefetch, fc, s, rng_, tol.atol, tol.rtol);
    }
  }
}

// The pipelined decode kernel (fp16 / bf16 and per-token quantized caches, head_dim 64 / 128 /
// 256, at most 8 query rows per KV head) through the backend: its shared memory opted in, its
// split plan from the measured occupancy, one wave and unsplit; split, replayed from a graph
// (its merge counters zeroed again by every launch). Emulated on smaller shapes:
// what it adds to attention_emulation_test is the backend's launch path.
TEST_F(CudaBackendTest, PipelinedAttentionMatchesCpu) {
#ifdef KVSERVE_CUDA_EMULATED
  const std::vector<Shape> shapes = {
      {8, 2, 128, 16, {{0, 1}, {700, 1}, {15, 1}}},
      {8, 2, 64, 8, {{300, 1}, {600, 2}}},
      {2, 2, 256, 32, {{540, 1}, {17, 1}}},
  };
#else
  const std::vector<Shape> shapes = {
      {32, 8, 128, 16, {{0, 1}, {700, 1}, {4000, 1}, {15, 1}, {1023, 1}}},
      {16, 4, 64, 8, {{300, 1}, {1000, 2}}},  // two query tokens: 8 rows per KV head
      {8, 8, 256, 32, {{3000, 1}, {17, 1}}},  // MHA at head_dim 256
  };
#endif
  ASSERT_OK_AND_ASSIGN(auto split, CreateCudaBackend({.attention_pipelined = true}));
  ASSERT_OK_AND_ASSIGN(auto unsplit, CreateCudaBackend({.max_attention_workspace_bytes = 0,
                                                        .attention_pipelined = true}));
  for (const FormatCase& fc : Formats()) {
    const bool per_token = fc.k.granularity == KvGranularity::kPerToken &&
                           fc.v.granularity == KvGranularity::kPerToken;
    if (fc.k.dtype != KvDType::kFp16 && fc.k.dtype != KvDType::kBf16 && !per_token) continue;
    const Tolerance tol = TensorCoreTolerance(fc.k.dtype);
    for (const Shape& s : shapes) {
      CheckFormatOnShape(*cpu_, *split, fc, s, rng_, tol.atol, tol.rtol, true, /*replay=*/true);
      CheckFormatOnShape(*cpu_, *unsplit, fc, s, rng_, tol.atol, tol.rtol);
    }
  }
}

TEST_F(CudaBackendTest, CopyBlocksBetweenDeviceAndPinnedHost) {
  const KvFormat f{KvDType::kInt4, KvGranularity::kPerGroup, 32};
  const int64_t blocks = 12, heads = 2, bs = 16, d = 64, layers = 2;
  std::vector<Pool> host_pools, pinned_ref;
  std::vector<std::unique_ptr<DevPool>> dev_pools;
  std::vector<KvCacheView> dev_views, pinned_views;
  std::vector<void*> pinned;
  for (int64_t l = 0; l < layers; ++l) {
    Pool p(f, f, blocks, heads, bs, d);
    for (auto& b : p.k) b = static_cast<uint8_t>(rng_());
    for (auto& b : p.v) b = static_cast<uint8_t>(rng_());
    for (auto& s : p.ks) s = static_cast<uint16_t>(rng_());
    for (auto& s : p.vs) s = static_cast<uint16_t>(rng_());
    dev_pools.push_back(std::make_unique<DevPool>(p));
    dev_views.push_back(dev_pools.back()->view);
    host_pools.push_back(std::move(p));
    // A pinned, mapped host pool of the same shape (the swap space), zeroed.
    KvCacheView h = dev_views.back();
    for (auto [ptr, bytes] : {std::pair{&h.k, host_pools.back().k.size()},
                              std::pair{&h.v, host_pools.back().v.size()}}) {
      void* mem = nullptr;
      ASSERT_CUDA(cudaHostAlloc(&mem, bytes, cudaHostAllocMapped));
      std::memset(mem, 0, bytes);
      pinned.push_back(mem);
      *ptr = static_cast<uint8_t*>(mem);
    }
    for (auto [ptr, count] : {std::pair{&h.k_scales, host_pools.back().ks.size()},
                              std::pair{&h.v_scales, host_pools.back().vs.size()}}) {
      void* mem = nullptr;
      ASSERT_CUDA(cudaHostAlloc(&mem, 2 * count, cudaHostAllocMapped));
      std::memset(mem, 0, 2 * count);
      pinned.push_back(mem);
      *ptr = static_cast<uint16_t*>(mem);
    }
    pinned_views.push_back(h);
  }
  // Copy-on-write inside the device pool, swap-out to the host pool, swap back in.
  std::vector<int32_t> src = {3, 7, 0}, dst = {9, 1, 11};
  gpu_->CopyBlocks({dev_views.data(), dev_views.data(), layers, src.data(), dst.data(), 3});
  std::vector<int32_t> out_src = {9, 1}, out_dst = {4, 5};
  gpu_->CopyBlocks(
      {dev_views.data(), pinned_views.data(), layers, out_src.data(), out_dst.data(), 2});
  std::vector<int32_t> in_src = {4, 5}, in_dst = {2, 6};
  gpu_->CopyBlocks(
      {pinned_views.data(), dev_views.data(), layers, in_src.data(), in_dst.data(), 2});
  Sync();
  // The same copies on the host reference.
  for (int64_t l = 0; l < layers; ++l) {
    Pool& p = host_pools[l];
    const int64_t kb = heads * bs * f.RowBytes(d), sb = heads * f.ScaleEntries(bs, d);
    auto copy = [&](int32_t s, int32_t t) {
      std::memcpy(p.k.data() + t * kb, p.k.data() + s * kb, kb);
      std::memcpy(p.v.data() + t * kb, p.v.data() + s * kb, kb);
      std::memcpy(p.ks.data() + t * sb, p.ks.data() + s * sb, 2 * sb);
      std::memcpy(p.vs.data() + t * sb, p.vs.data() + s * sb, 2 * sb);
    };
    for (int i = 0; i < 3; ++i) copy(src[i], dst[i]);
    EXPECT_EQ(std::memcmp(pinned_views[l].k + 4 * kb, p.k.data() + 9 * kb, kb), 0);
    EXPECT_EQ(std::memcmp(pinned_views[l].v + 5 * kb, p.v.data() + 1 * kb, kb), 0);
    copy(9, 2);
    copy(1, 6);
    EXPECT_EQ(dev_pools[l]->k.Host(), p.k);
    EXPECT_EQ(dev_pools[l]->v.Host(), p.v);
    EXPECT_EQ(dev_pools[l]->ks.Host(), p.ks);
    EXPECT_EQ(dev_pools[l]->vs.Host(), p.vs);
  }
  for (void* mem : pinned) cudaFreeHost(mem);
}

// Sampling draws exactly the CPU twin's token: the rule is integer arithmetic over weights
// computed with explicitly rounded float steps (kernels/sampling.h). Logprobs of the draws
// name the same top ids.
// The device's fingerprint of ranges (the NCCL transfer's check) is the host's, for odd
// lengths, an unaligned start and an empty range; a flipped bit or swapped words change it.
TEST_F(CudaBackendTest, FingerprintMatchesTheHosts) {
  std::mt19937 rng(7);
  std::vector<uint8_t> bytes(100003);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  auto* dev = static_cast<uint8_t*>(gpu_->Allocate(bytes.size()));
  gpu_->Upload(dev, bytes.data(), bytes.size());
  const std::vector<ByteRange> ranges = {
      {dev, 100000}, {dev + 3, 13}, {dev + 100000, 0}, {dev + 1, 100002}};
  std::vector<uint64_t> each;
  each.push_back(FingerprintBytes(bytes.data(), 100000));
  each.push_back(FingerprintBytes(bytes.data() + 3, 13));
  each.push_back(FingerprintBytes(bytes.data(), 0));
  each.push_back(FingerprintBytes(bytes.data() + 1, 100002));
  const uint64_t want = CombineFingerprints(each.data(), each.size());
  EXPECT_EQ(gpu_->Fingerprint(ranges), want);
  EXPECT_EQ(cpu_->Fingerprint({{bytes.data(), 100000},
                               {bytes.data() + 3, 13},
                               {bytes.data(), 0},
                               {bytes.data() + 1, 100002}}),
            want);
  bytes[777] ^= 0x10;
  gpu_->Upload(dev, bytes.data(), bytes.size());
  EXPECT_NE(gpu_->Fingerprint(ranges), want);
  bytes[777] ^= 0x10;
  std::swap_ranges(bytes.begin(), bytes.begin() + 8, bytes.begin() + 8);
  gpu_->Upload(dev, bytes.data(), bytes.size());
  EXPECT_NE(gpu_->Fingerprint(ranges), want);
  gpu_->Free(dev);
}

TEST_F(CudaBackendTest, SampleMatchesCpuTokenForToken) {
  for (const SamplingCase& c :
       {SamplingCase{3, 1, 1, false}, SamplingCase{5, 7, 7, true},
        SamplingCase{8, 1000, 1000, true}, SamplingCase{8, 32000, 32000, false},
        SamplingCase{6, 151936, 151936, false}, SamplingCase{4, 151936, 37984, false},
        SamplingCase{4, 1000, 256, true}}) {
    SCOPED_TRACE(c.Name());
    const std::vector<float> logits = SamplingLogits(c, rng_);
    const std::vector<SampleRequest> requests = SamplingRequests(c, 96, rng_);
    Dev<float> d_logits(logits);
    Dev<SampleRequest> d_requests(requests);
    Dev<int32_t> d_tokens(requests.size());
    SampleParams p;
    p.num_rows = c.rows;
    p.vocab = c.vocab;
    p.shard_vocab = c.shard;
    p.num_requests = static_cast<int64_t>(requests.size());
    p.logits = d_logits.get();
    p.requests = d_requests.get();
    p.tokens = d_tokens.get();
    gpu_->Sample(p);
    Sync();
    std::vector<int32_t> expected(requests.size(), -1);
    p.logits = logits.data();
    p.requests = requests.data();
    p.tokens = expected.data();
    cpu_->Sample(p);
    const std::vector<int32_t> got = d_tokens.Host();
    for (size_t k = 0; k < requests.size(); ++k) {
      EXPECT_EQ(got[k], expected[k])
          << "request " << k << " T " << requests[k].temperature << " top_k " << requests[k].top_k
          << " top_p " << requests[k].top_p << " min_p " << requests[k].min_p;
    }

    // Logprobs of those draws: the same top ids (ties by id), values within float rounding.
    const std::vector<LogprobRequest> lq = LogprobRequestsFor(requests, c.vocab);
    const size_t nl = lq.size(), top = nl * kMaxTopLogprobs;
    Dev<LogprobRequest> d_lq(lq);
    Dev<float> d_logprob(nl), d_top_values(top);
    Dev<int32_t> d_top_ids(std::vector<int32_t>(top, -1)), d_rank(nl);
    LogprobsParams lp;
    lp.num_rows = c.rows;
    lp.vocab = c.vocab;
    lp.shard_vocab = c.shard;
    lp.num_requests = static_cast<int64_t>(nl);
    lp.logits = d_logits.get();
    lp.tokens = d_tokens.get();
    lp.requests = d_lq.get();
    lp.logprob = d_logprob.get();
    lp.rank = d_rank.get();
    lp.top_ids = d_top_ids.get();
    lp.top_logprobs = d_top_values.get();
    gpu_->Logprobs(lp);
    Sync();
    std::vector<float> want_logprob(nl), want_values(top);
    std::vector<int32_t> want_ids(top, -1), want_rank(nl);
    lp.logits = logits.data();
    lp.tokens = expected.data();
    lp.requests = lq.data();
    lp.logprob = want_logprob.data();
    lp.rank = want_rank.data();
    lp.top_ids = want_ids.data();
    lp.top_logprobs = want_values.data();
    cpu_->Logprobs(lp);
    EXPECT_LE(WorstRatio(d_logprob.Host(), want_logprob, 1e-5, 1e-6), 1.0) << "logprobs differ";
    EXPECT_EQ(d_rank.Host(), want_rank);
    const std::vector<int32_t> ids = d_top_ids.Host();
    const std::vector<float> values = d_top_values.Host();
    for (size_t k = 0; k < nl; ++k) {
      for (int i = 0; i < std::min<int64_t>(lq[k].top_n, c.vocab); ++i) {
        const size_t at = k * kMaxTopLogprobs + i;
        EXPECT_EQ(ids[at], want_ids[at]) << "logprob request " << k << " rank " << i;
        EXPECT_NEAR(values[at], want_values[at], 1e-5) << "logprob request " << k << " rank " << i;
      }
    }
  }
}

TEST_F(CudaBackendTest, KvSupportCheckNamesWhatIsMissing) {
  KvQuantOptions int8;
  int8.dtype = "int8";
  ASSERT_OK_AND_ASSIGN(KvCacheSpec spec, MakeKvCacheSpec(int8, 2, 128));
  EXPECT_OK(CheckCudaKvSupport(spec, 128, 16, 0));
  EXPECT_FALSE(CheckCudaKvSupport(spec, 96, 16, 0).ok());
  EXPECT_FALSE(CheckCudaKvSupport(spec, 128, 24, 0).ok());
  // MakeKvCacheSpec already refuses such a group size; the backend checks on its own too.
  KvCacheSpec grouped = spec;
  grouped.k[1] = {KvDType::kInt4, KvGranularity::kPerGroup, 12};
  const absl::Status s = CheckCudaKvSupport(grouped, 128, 16, 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("powers of two"), std::string::npos) << s;
  // fp8 is accepted from compute capability 8.9 on, refused below with a message naming it.
  KvQuantOptions fp8;
  fp8.dtype = "fp8_e4m3";
  ASSERT_OK_AND_ASSIGN(KvCacheSpec fp8_spec, MakeKvCacheSpec(fp8, 2, 128));
  int major = 0, minor = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  ASSERT_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  const absl::Status f = CheckCudaKvSupport(fp8_spec, 128, 16, 0);
  if (major * 10 + minor >= 89) {
    EXPECT_OK(f);
  } else {
    EXPECT_NE(f.message().find("compute capability 8.9"), std::string::npos) << f;
  }
}

}  // namespace
}  // namespace kvserve::kernels
