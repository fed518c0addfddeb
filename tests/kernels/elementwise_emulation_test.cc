// The CUDA backend's row-wise kernels (kernels/cuda/ops/elementwise.cuh), run on the CPU by
// tests/testing/cuda_emulator/emulator.h with the launchers' grids (elementwise.cu), against the
// CPU backend: embedding from float32 / bf16 / fp16 tables, RMSNorm plain, with the fused residual
// and over row groups (Qwen3's per-head norms inside qkv rows), RoPE on strided rows, SiLU·mul,
// bias add and float32 → fp16 / bf16 rounding, and the row ops' 16-bit outputs.
// tests/gpu/cuda_backend_test.cc runs the same on a GPU. The emulation comes first: it redefines
// the CUDA keywords the kernel sources use.
// clang-format off
#include "tests/testing/cuda_emulator/emulator.h"
// clang-format on

#include <cmath>
#include <random>
#include <vector>

#include "common/model/dtype.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/ops/elementwise.cuh"
#include "tests/kernels/attention_cases.h"

namespace kvserve::kernels {
namespace {

namespace ew = cuda::elementwise;

// One block of ew::kThreads per row, as the launchers run them.
void PerRow(int64_t rows, const std::function<void()>& kernel) {
  emulation::Launch({static_cast<int>(rows), 1, 1}, ew::kThreads, 0, kernel);
}

TEST(ElementwiseEmulationTest, RowOpsMatchCpu) {
  const std::unique_ptr<Backend> cpu = CreateCpuBackend({.num_threads = 1});
  std::mt19937 rng(7);
  const int64_t tokens = 5, hidden = 512 + 64, vocab = 50, heads = 3, d = 128, inter = 300;

  // Embedding from float32, bf16 and fp16 tables.
  const std::vector<float> table = Random(vocab * hidden, rng);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  std::vector<uint16_t> bf16(table.size()), fp16(table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    bf16[i] = FloatToBf16(table[i]);
    fp16[i] = FloatToF16(table[i]);
  }
  std::vector<float> want(tokens * hidden), got(tokens * hidden, std::nanf(""));
  cpu->Embedding({ids.data(), table.data(), want.data(), tokens, hidden});
  PerRow(tokens, [&] { ew::EmbeddingKernel(ids.data(), table.data(), got.data(), hidden); });
  EXPECT_EQ(got, want);
  cpu->Embedding({ids.data(), bf16.data(), want.data(), tokens, hidden, DType::kBF16});
  PerRow(tokens, [&] {
    ew::EmbeddingKernel(ids.data(), reinterpret_cast<const __nv_bfloat16*>(bf16.data()), got.data(),
                        hidden);
  });
  EXPECT_EQ(got, want);
  cpu->Embedding({ids.data(), fp16.data(), want.data(), tokens, hidden, DType::kF16});
  PerRow(tokens, [&] {
    ew::EmbeddingKernel(ids.data(), reinterpret_cast<const __half*>(fp16.data()), got.data(),
                        hidden);
  });
  EXPECT_EQ(got, want);

  // RMSNorm, plain and with the fused residual (in place).
  const std::vector<float> x = Random(tokens * hidden, rng), res = Random(tokens * hidden, rng),
                           weight = Random(hidden, rng);
  cpu->RmsNorm({x.data(), nullptr, weight.data(), want.data(), tokens, hidden, 1e-5f});
  PerRow(tokens, [&] {
    ew::RmsNormKernel<float>(x.data(), nullptr, weight.data(), got.data(), hidden, 1e-5f, 0, 0);
  });
  EXPECT_LE(WorstRatio(got, want, 1e-5, 1e-5), 1.0);
  std::vector<float> x_cpu = x, res_cpu = res, x_emu = x, res_emu = res;
  cpu->RmsNorm({x_cpu.data(), res_cpu.data(), weight.data(), x_cpu.data(), tokens, hidden, 1e-5f});
  PerRow(tokens, [&] {
    ew::RmsNormKernel<float>(x_emu.data(), res_emu.data(), weight.data(), x_emu.data(), hidden,
                             1e-5f, 0, 0);
  });
  EXPECT_LE(WorstRatio(x_emu, x_cpu, 1e-5, 1e-5), 1.0);
  EXPECT_LE(WorstRatio(res_emu, res_cpu, 1e-6, 1e-6), 1.0);

  // RMSNorm over groups of rows: the q heads of every token's qkv row, in place; the k and v
  // parts of the rows must stay as they were.
  const int64_t stride = heads * d + 2 * d;
  const std::vector<float> qkv = Random(tokens * stride, rng), qw = Random(d, rng);
  std::vector<float> qkv_cpu = qkv, qkv_emu = qkv;
  cpu->RmsNorm({qkv_cpu.data(), nullptr, qw.data(), qkv_cpu.data(), tokens * heads, d, 1e-6f, heads,
                stride});
  PerRow(tokens * heads, [&] {
    ew::RmsNormKernel<float>(qkv_emu.data(), nullptr, qw.data(), qkv_emu.data(), d, 1e-6f, heads,
                             stride);
  });
  EXPECT_LE(WorstRatio(qkv_emu, qkv_cpu, 1e-5, 1e-5), 1.0);

  // RoPE on strided rows (the q heads of qkv rows), llama3-style scaled frequencies.
  std::vector<float> inv_freq(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    inv_freq[i] = std::pow(500000.0f, -2.0f * i / d) / (i > 40 ? 8.0f : 1.0f);
  }
  const std::vector<int32_t> pos = {0, 1, 700, 8191, 100000};
  std::vector<float> rows_cpu = qkv, rows_emu = qkv;
  cpu->Rope({rows_cpu.data(), pos.data(), inv_freq.data(), tokens, heads, d, stride});
  PerRow(tokens,
         [&] { ew::RopeKernel(rows_emu.data(), pos.data(), inv_freq.data(), heads, d, stride); });
  EXPECT_LE(WorstRatio(rows_emu, rows_cpu, 2e-4, 2e-4), 1.0);

  // SiLU-gated activation.
  const std::vector<float> gate_up = Random(tokens * 2 * inter, rng, 3.0f);
  std::vector<float> act_cpu(tokens * inter), act_emu(tokens * inter, std::nanf(""));
  cpu->SiluMul({gate_up.data(), act_cpu.data(), tokens, inter});
  PerRow(tokens, [&] { ew::SiluMulKernel<float>(gate_up.data(), act_emu.data(), inter); });
  EXPECT_LE(WorstRatio(act_emu, act_cpu, 1e-6, 1e-5), 1.0);

  // Bias add, and rounding to fp16 / bf16 bit patterns (grid-stride over 3 blocks).
  std::vector<float> y = x, y_want = x;
  for (int64_t r = 0; r < tokens; ++r) {
    for (int64_t c = 0; c < hidden; ++c) y_want[r * hidden + c] += weight[c];
  }
  PerRow(tokens, [&] { ew::AddBiasKernel(y.data(), weight.data(), hidden); });
  EXPECT_EQ(y, y_want);
  for (const bool to_bf16 : {false, true}) {
    std::vector<uint16_t> bits(x.size(), 0);
    emulation::Launch({3, 1, 1}, ew::kThreads, 0, [&] {
      ew::RoundTo16Kernel(x.data(), bits.data(), static_cast<int64_t>(x.size()), to_bf16);
    });
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(bits[i], to_bf16 ? FloatToBf16(x[i]) : FloatToF16(x[i])) << i;
    }
  }
}

// RMSNorm (with the fused residual) and SiLU·mul writing fp16 / bf16 for a Gemm's x16: bit for
// bit the float32 kernels' outputs rounded, as the Gemm's own rounding would make them.
TEST(ElementwiseEmulationTest, SixteenBitOutputsAreTheFloatOutputsRounded) {
  std::mt19937 rng(11);
  const int64_t tokens = 3, hidden = 640, inter = 300;
  const std::vector<float> x = Random(tokens * hidden, rng), res = Random(tokens * hidden, rng),
                           weight = Random(hidden, rng);
  const std::vector<float> gate_up = Random(tokens * 2 * inter, rng, 3.0f);
  std::vector<float> norm(tokens * hidden), act(tokens * inter);
  std::vector<float> res_float = res;
  PerRow(tokens, [&] {
    ew::RmsNormKernel<float>(x.data(), res_float.data(), weight.data(), norm.data(), hidden, 1e-5f,
                             0, 0);
  });
  PerRow(tokens, [&] { ew::SiluMulKernel<float>(gate_up.data(), act.data(), inter); });
  auto check = [](const std::vector<uint16_t>& got, const std::vector<float>& want, bool bf16) {
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], bf16 ? FloatToBf16(want[i]) : FloatToF16(want[i])) << i;
    }
  };
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp16");
    std::vector<uint16_t> norm16(norm.size(), 0xffff), act16(act.size(), 0xffff);
    std::vector<float> res16 = res;
    PerRow(tokens, [&] {
      if (bf16) {
        ew::RmsNormKernel(x.data(), res16.data(), weight.data(),
                          reinterpret_cast<__nv_bfloat16*>(norm16.data()), hidden, 1e-5f, 0, 0);
      } else {
        ew::RmsNormKernel(x.data(), res16.data(), weight.data(),
                          reinterpret_cast<__half*>(norm16.data()), hidden, 1e-5f, 0, 0);
      }
    });
    PerRow(tokens, [&] {
      if (bf16) {
        ew::SiluMulKernel(gate_up.data(), reinterpret_cast<__nv_bfloat16*>(act16.data()), inter);
      } else {
        ew::SiluMulKernel(gate_up.data(), reinterpret_cast<__half*>(act16.data()), inter);
      }
    });
    check(norm16, norm, bf16);
    check(act16, act, bf16);
    EXPECT_EQ(res16, res_float);  // the residual stream is float32 either way
  }
}

}  // namespace
}  // namespace kvserve::kernels
