// The CUDA paged-attention kernels, run on the CPU by tests/testing/cuda_emulator/emulator.h,
// against the CPU backend's paged attention: the tensor-core kernel (paged_attention_mma.cuh) and
// the SIMT kernel (paged_attention_simt.cuh), every KV format, decode batches, prefill chunks over
// cached prefixes, GQA 4:1 and 8:1, head_dim 64 / 128 (and 16 / 32 / 256, SIMT), with and
// without split-KV (the real split-merging kernel, emulated too), each launch cut by the real
// planner.
// The kernels are compiled as for the GPU except for mma.sync and movmatrix, which the
// emulation performs by PTX's fragment layouts, so this catches wrong indices, masks, softmax,
// barriers and quantized-code handling before a GPU runs them. It cannot catch what only
// hardware shows (memory-model races, speed); tests/gpu/cuda_backend_test.cc runs the same
// cases on a GPU.
// The emulation comes first: it redefines the CUDA keywords the kernel sources use.
// clang-format off
#include "tests/testing/cuda_emulator/emulator.h"
// clang-format on

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/attention/paged_attention.h"
#include "kernels/cuda/attention/paged_attention_mma.cuh"
#include "kernels/cuda/attention/paged_attention_pipelined.cuh"
#include "kernels/cuda/attention/paged_attention_simt.cuh"
#include "tests/kernels/attention_cases.h"

namespace kvserve::kernels {
namespace {

using cuda::AttnArgs;
using cuda::AttnPlan;

// The launch of LaunchPagedAttention, emulated: the plan's kernel, then the split merge (the
// pipelined kernel's own, counting in `counters`).
template <KvDType DT, int HD>
void RunEmulated(const AttnArgs& a, const AttnPlan& plan, std::vector<float>& workspace,
                 std::vector<unsigned>& counters) {
  namespace at = cuda::attention;
  float* tmp_out = workspace.data();
  float* tmp_ms = plan.num_splits > 1 ? workspace.data() + int64_t{a.num_seqs} * a.max_query_len *
                                                               a.num_heads * plan.num_splits * HD
                                      : nullptr;
  const emulation::Index grid{plan.row_tiles, a.num_kv_heads * plan.num_splits, a.num_seqs};
  if (plan.pipelined) {
    if constexpr (DT != KvDType::kFp32 && HD >= 64) {
      // The launcher opts in to this much shared memory (PreparePipelinedAttention).
      emulation::Launch(
          grid, at::kThreads, at::PipelineShape<DT, HD>::kSharedBytes,
          [&] {
            at::PagedAttentionPipelinedKernel<DT, HD>(a, plan, tmp_out, tmp_ms, counters.data());
          },
          emulation::kMaxOptInSharedBytes);
    } else {
      FAIL() << "the pipelined kernel does not take this format or head_dim";
    }
    return;
  } else if (plan.tensor_cores) {
    if constexpr (DT != KvDType::kFp32 && (HD == 64 || HD == 128)) {
      emulation::Launch(grid, at::kThreads, sizeof(float) * at::kWarps * 16 * HD, [&] {
        if (plan.prefetch_k) {
          at::PagedAttentionMmaKernel<DT, HD, true>(a, plan, tmp_out, tmp_ms);
        } else {
          at::PagedAttentionMmaKernel<DT, HD, false>(a, plan, tmp_out, tmp_ms);
        }
      });
    } else {
      FAIL() << "the tensor-core kernel does not take this format or head_dim";
    }
  } else if (plan.rows_per_block == 4) {
    emulation::Launch(grid, at::kThreads, sizeof(float) * at::kWarps * 4 * HD,
                      [&] { at::PagedAttentionKernel<DT, 4, HD>(a, plan, tmp_out, tmp_ms); });
  } else {
    emulation::Launch(grid, at::kThreads, sizeof(float) * at::kWarps * 8 * HD,
                      [&] { at::PagedAttentionKernel<DT, 8, HD>(a, plan, tmp_out, tmp_ms); });
  }
  if (plan.num_splits > 1) {
    emulation::Launch({a.num_heads, a.max_query_len, a.num_seqs}, at::kCombineThreads, 0,
                      [&] { at::CombineSplits(a, plan.num_splits, tmp_out, tmp_ms); });
  }
}

template <int HD>
void RunEmulatedFor(KvDType dt, const AttnArgs& a, const AttnPlan& plan,
                    std::vector<float>& workspace, std::vector<unsigned>& counters) {
  switch (dt) {
    case KvDType::kFp32:
      return RunEmulated<KvDType::kFp32, HD>(a, plan, workspace, counters);
    case KvDType::kFp16:
      return RunEmulated<KvDType::kFp16, HD>(a, plan, workspace, counters);
    case KvDType::kBf16:
      return RunEmulated<KvDType::kBf16, HD>(a, plan, workspace, counters);
    case KvDType::kFp8E4M3:
      return RunEmulated<KvDType::kFp8E4M3, HD>(a, plan, workspace, counters);
    case KvDType::kInt8:
      return RunEmulated<KvDType::kInt8, HD>(a, plan, workspace, counters);
    case KvDType::kInt4:
      return RunEmulated<KvDType::kInt4, HD>(a, plan, workspace, counters);
  }
}

enum class Kernel { kSimt, kTensorCores, kTensorCoresPrefetchK, kPipelined };

const char* KernelName(Kernel k) {
  switch (k) {
    case Kernel::kSimt:
      return " SIMT";
    case Kernel::kTensorCores:
      return " tensor cores";
    case Kernel::kTensorCoresPrefetchK:
      return " tensor cores, K prefetched";
    case Kernel::kPipelined:
      return " pipelined";
  }
  return "";
}

// Writes every sequence's context through the CPU backend, runs the CPU's attention of the
// query tokens and the emulated kernel on the same pool, split as `num_sms` SMs would ask (0:
// not at all), and compares.
// With `out16`, the kernel also runs writing bf16 and must give the float output rounded, bit
// for bit.
void CheckFormatOnShape(Backend& cpu, const FormatCase& fc, const Shape& s, Kernel kernel,
                        int num_sms, std::mt19937& rng, int min_splits = 0, bool out16 = false) {
  const bool pipelined = kernel == Kernel::kPipelined;
  const bool tensor_cores = kernel != Kernel::kSimt && !pipelined;
  SCOPED_TRACE(Describe(fc, s) + " sms " + std::to_string(num_sms) + KernelName(kernel));
  const BatchLayout b = LayOut(s, rng);
  const int64_t num_seqs = b.num_seqs, max_blocks = b.max_blocks, max_q = b.max_query,
                max_ctx = b.max_context, tokens = b.query_tokens;
  const std::vector<int32_t>& tables = b.tables;
  Pool pool(fc.k, fc.v, b.pool_blocks, s.kv_heads, s.bs, s.d);
  // Every context token's q | k | v row; the query tokens' rows are the last of each sequence.
  const int64_t q_dim = s.heads * s.d, kv_dim = s.kv_heads * s.d, row = q_dim + 2 * kv_dim;
  std::vector<float> queries;
  std::vector<int32_t> qstart, qlen, ctx;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t n = s.seqs[i].prefix + s.seqs[i].query;
    std::vector<float> rows = Random(n * row, rng);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < n; ++t) slots.push_back(b.Slot(s, i, t));
    cpu.WriteKv(
        {rows.data() + q_dim, rows.data() + q_dim + kv_dim, row, slots.data(), n, pool.Host()});
    qstart.push_back(static_cast<int32_t>(queries.size() / row));
    qlen.push_back(s.seqs[i].query);
    ctx.push_back(static_cast<int32_t>(n));
    queries.insert(queries.end(), rows.end() - s.seqs[i].query * row, rows.end());
  }
  PagedAttentionParams p;
  p.q = queries.data();
  p.q_stride = row;
  p.cache = pool.Host();
  p.query_start = qstart.data();
  p.query_len = qlen.data();
  p.context_len = ctx.data();
  p.block_tables = tables.data();
  p.num_seqs = num_seqs;
  p.max_blocks_per_seq = max_blocks;
  p.num_heads = s.heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  p.max_query_len = max_q;
  p.max_context_len = max_ctx;
  std::vector<float> want(tokens * q_dim);
  p.out = want.data();
  cpu.PagedAttention(p);

  AttnArgs a = cuda::MakeAttnArgs(p);  // the CUDA backend's own mapping
  ASSERT_STREQ(cuda::CheckAttentionShape(a), "");
  const size_t max_workspace = num_sms > 0 ? size_t{1} << 28 : 0;
  AttnPlan plan =
      cuda::PlanPagedAttention(a, std::max(num_sms, 1), max_workspace, 0, tensor_cores, pipelined);
  ASSERT_EQ(plan.tensor_cores, tensor_cores);
  ASSERT_EQ(plan.pipelined, pipelined);
  plan.prefetch_k = kernel == Kernel::kTensorCoresPrefetchK;
  if (num_sms == 0) {
    EXPECT_EQ(plan.num_splits, 1);
  }
  if (min_splits > 0) {
    ASSERT_GE(plan.num_splits, min_splits);
  }
  ASSERT_EQ(plan.split_counters, pipelined && plan.num_splits > 1 ? num_seqs * s.kv_heads : 0);
  // NaN workspace, as a GPU's may hold: a split must not read what no block wrote. The merge
  // counters start zeroed and must be left so (the out16 run reuses them).
  std::vector<float> got(tokens * q_dim, std::nanf("")),
      workspace(plan.workspace_floats, std::nanf(""));
  std::vector<unsigned> counters(plan.split_counters, 0);
  a.out = got.data();
  auto run = [&] {
    if (s.d == 16) {
      RunEmulatedFor<16>(fc.k.dtype, a, plan, workspace, counters);
    } else if (s.d == 32) {
      RunEmulatedFor<32>(fc.k.dtype, a, plan, workspace, counters);
    } else if (s.d == 64) {
      RunEmulatedFor<64>(fc.k.dtype, a, plan, workspace, counters);
    } else if (s.d == 128) {
      RunEmulatedFor<128>(fc.k.dtype, a, plan, workspace, counters);
    } else {
      RunEmulatedFor<256>(fc.k.dtype, a, plan, workspace, counters);
    }
    for (const unsigned c : counters) ASSERT_EQ(c, 0u) << "a merge counter left set";
  };
  run();
  // SIMT: float32 arithmetic throughout, the GPU test's tolerances.
  const Tolerance tol =
      kernel != Kernel::kSimt ? TensorCoreTolerance(fc.k.dtype) : Tolerance{2e-5, 2e-4};
  EXPECT_LE(WorstRatio(got, want, tol.atol, tol.rtol), 1.0)
      << "splits " << plan.num_splits << ", rows per block " << plan.rows_per_block;
  if (out16) {
    std::vector<uint16_t> got16(got.size(), 0xffff);
    std::fill(workspace.begin(), workspace.end(), std::nanf(""));
    a.out = nullptr;
    a.out16 = got16.data();
    a.out16_bf16 = true;
    run();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got16[i], FloatToBf16(got[i])) << i;
  }
}

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      // Decode (GQA 4:1): an empty prefix, contexts of several chunks (split-KV), one inside a
      // block.
      {8, 2, 128, 16, {{0, 1}, {700, 1}, {1500, 1}, {15, 1}}},
      // Prefill chunks of 200 and 160 rows, over a cached prefix and over none.
      {8, 2, 128, 16, {{500, 50}, {0, 40}}},
      // Prefill chunks over cached prefixes next to decodes, GQA 8:1, head_dim 64, block 8.
      {16, 2, 64, 8, {{0, 37}, {300, 20}, {5, 3}, {90, 1}}},
      // GQA 8:1 at head_dim 128, block 32: 16 rows (decode style) next to 72 (prefill style).
      {16, 2, 128, 32, {{300, 2}, {17, 1}, {40, 9}}},
  };
  return shapes;
}

TEST(AttentionEmulationTest, TensorCoreKernelMatchesCpuForEveryFormat) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(7);
  for (const FormatCase& fc : Formats()) {
    if (fc.k.dtype == KvDType::kFp32) continue;  // the SIMT kernel's
    for (const Shape& s : Shapes()) {
      for (const Kernel k : {Kernel::kTensorCores, Kernel::kTensorCoresPrefetchK}) {
        CheckFormatOnShape(*cpu, fc, s, k, 0, rng);   // one block walks a whole context
        CheckFormatOnShape(*cpu, fc, s, k, 16, rng);  // split-KV
      }
    }
  }
}

TEST(AttentionEmulationTest, SimtKernelMatchesCpuForEveryFormat) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(11);
  std::vector<Shape> shapes = Shapes();
  shapes.push_back({4, 4, 256, 32, {{90, 17}, {300, 1}}});  // MHA, head_dim 256
  // The test fixtures' small heads: head_dim 16 (GQA 4:1) and 32 (4:1, one KV head).
  shapes.push_back({8, 2, 16, 16, {{0, 1}, {300, 1}, {40, 9}}});
  shapes.push_back({4, 1, 32, 8, {{700, 1}, {0, 20}}});
  for (const FormatCase& fc : Formats()) {
    for (const Shape& s : shapes) {
      if (fc.k.group_size > s.d) continue;  // groups wider than the head
      CheckFormatOnShape(*cpu, fc, s, Kernel::kSimt, 0, rng);
      CheckFormatOnShape(*cpu, fc, s, Kernel::kSimt, 16, rng);
    }
  }
}

// The formats the pipelined decode kernel takes: fp16 / bf16 and per-token quantized K and V.
std::vector<FormatCase> PipelinedFormats() {
  std::vector<FormatCase> formats;
  for (const FormatCase& fc : Formats()) {
    const bool per_token = fc.k.granularity == KvGranularity::kPerToken &&
                           fc.v.granularity == KvGranularity::kPerToken;
    if (fc.k.dtype == KvDType::kFp16 || fc.k.dtype == KvDType::kBf16 || per_token) {
      formats.push_back(fc);
    }
  }
  return formats;
}

// The pipelined decode kernel: head_dim 64 / 128 / 256, blocks of 8 / 16 / 32 tokens, GQA 1, 2,
// 4 and 8, one and several query tokens per sequence (up to 8 rows per KV head), contexts that
// end inside a tile and a block, one sequence's splits next to another's fewer, unsplit and
// split (at least 256 tokens a split); int8 also writing bf16 (AttnArgs::out16), which must be
// the float output rounded.
TEST(AttentionEmulationTest, PipelinedKernelMatchesCpu) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(19);
  const std::vector<Shape> shapes = {
      {4, 1, 128, 16, {{0, 1}, {700, 1}, {300, 1}}},  // GQA 4:1
      {8, 1, 64, 8, {{250, 1}, {100, 1}}},            // GQA 8:1, head_dim 64, block 8
      {2, 2, 256, 32, {{540, 1}, {40, 1}}},           // MHA, head_dim 256, block 32
      {8, 2, 128, 32, {{200, 2}, {63, 2}}},           // two query tokens: 8 rows
      {4, 2, 64, 16, {{500, 4}}},                     // GQA 2:1, four query tokens
  };
  for (const FormatCase& fc : PipelinedFormats()) {
    for (const Shape& s : shapes) {
      CheckFormatOnShape(*cpu, fc, s, Kernel::kPipelined, 0, rng);
      // 16 SMs: 32 blocks in a wave; the longer contexts split (in 2 or 3).
      CheckFormatOnShape(*cpu, fc, s, Kernel::kPipelined, 16, rng, s.seqs[0].prefix >= 500 ? 2 : 0,
                         /*out16=*/fc.name == "int8/per_token");
    }
  }
}

// Both kernels writing bf16 for the O projection (AttnArgs::out16): whole rows from one block
// (decode and prefill rows) and from the split merge, bit for bit the float output rounded.
TEST(AttentionEmulationTest, SixteenBitOutputIsTheFloatOutputRounded) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(17);
  for (const FormatCase& fc : Formats()) {
    if (fc.name != "int8/per_token") continue;
    for (const Shape& s : Shapes()) {
      for (const Kernel k : {Kernel::kSimt, Kernel::kTensorCores}) {
        CheckFormatOnShape(*cpu, fc, s, k, 0, rng, 0, true);
        CheckFormatOnShape(*cpu, fc, s, k, 16, rng, 0, true);
      }
    }
  }
}

// More splits than the merging kernel's warps (it gives each warp every eighth split), next to
// a sequence whose context ends before most of them start.
TEST(AttentionEmulationTest, ManySplitsMerge) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(13);
  const Shape s{8, 2, 128, 16, {{4300, 1}, {300, 1}}};  // 17 chunks
  for (const FormatCase& fc : Formats()) {
    if (fc.name != "bf16" && fc.name != "int4/per_token") continue;
    for (const Kernel k : {Kernel::kSimt, Kernel::kTensorCores, Kernel::kTensorCoresPrefetchK}) {
      CheckFormatOnShape(*cpu, fc, s, k, 16, rng, 17);
    }
  }
}

// The pipelined kernel's own merge past one round of its 32 splits' weights a warp passes
// round (36 and 9 splits), next to a sequence shorter than most splits start; GQA 8:1 fills
// the block's 8 rows, two a warp.
TEST(AttentionEmulationTest, PipelinedManySplitsMerge) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(23);
  const Shape s{8, 1, 64, 16, {{9000, 1}, {2100, 1}, {70, 1}}};
  for (const FormatCase& fc : PipelinedFormats()) {
    if (fc.name != "bf16" && fc.name != "int4/per_token") continue;
    CheckFormatOnShape(*cpu, fc, s, Kernel::kPipelined, 64, rng, 36, /*out16=*/true);
  }
}

}  // namespace
}  // namespace kvserve::kernels
