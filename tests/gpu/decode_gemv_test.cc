// The CUDA backend's DecodeGemv (kernels/cuda/ops/decode_gemv.cuh) against the ops it fuses:
// the CPU backend's RmsNorm, Gemm and SiluMul in a row (Backend::DecodeGemv's reference), for
// bf16 and fp16 weights, 1 to 8 rows, inputs given rounded or normalized (with and without a
// residual), plain outputs or the SiLU·mul; the residual sum exactly, the normalized input bit for
// bit the CUDA RmsNorm's (through an identity matrix). Part of cuda_backend_test. Skipped
// without a CUDA device; the emulated build runs it in every thread order.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/model/dtype.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/nccl_communicator.h"
#include "tests/gpu/dev_buffer.h"
#include "tests/kernels/attention_cases.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::kernels {
namespace {

uint16_t To16(float v, DType t) { return t == DType::kBF16 ? FloatToBf16(v) : FloatToF16(v); }
float From16(uint16_t v, DType t) { return t == DType::kBF16 ? Bf16ToFloat(v) : F16ToFloat(v); }

std::vector<uint16_t> Rounded(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = To16(v[i], t);
  return out;
}

std::vector<float> Widened(const std::vector<uint16_t>& v, DType t) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = From16(v[i], t);
  return out;
}

class DecodeGemvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_OK_AND_ASSIGN(gpu_, CreateCudaBackend({.decode_gemv_max_rows = 8}));
    cpu_ = CreateCpuBackend({});
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::mt19937 rng_{11};
};

struct Case {
  bool norm, residual, silu, bias;
};

// The fixture's GPU DecodeGemv against the CPU backend's RmsNorm, Gemm and SiluMul in a row, on
// fresh random inputs of m rows, k columns and `outputs` outputs.
void ExpectMatchesCpu(Backend& gpu, Backend& cpu, std::mt19937& rng, DType wt, int64_t m, int64_t k,
                      int64_t outputs, const Case& c) {
  SCOPED_TRACE(std::string(DTypeName(wt)) + " m " + std::to_string(m) + " k " + std::to_string(k) +
               " norm " + std::to_string(c.norm) + " residual " + std::to_string(c.residual) +
               " silu " + std::to_string(c.silu) + " bias " + std::to_string(c.bias));
  const int64_t w_rows = c.silu ? 2 * outputs : outputs;
  const std::vector<uint16_t> w = Rounded(Random(w_rows * k, rng, 0.05f), wt);
  const std::vector<float> x = Random(m * k, rng), res = Random(m * k, rng), gamma = Random(k, rng),
                           bias = Random(w_rows, rng);
  const std::vector<uint16_t> x16 = Rounded(x, wt);
  std::vector<float> y(m * outputs), res_out(m * k);
  std::vector<uint16_t> out16(m * outputs);
  DecodeGemvParams p{.x16 = c.norm ? nullptr : x16.data(),
                     .w = w.data(),
                     .w_type = wt,
                     .bias = c.bias ? bias.data() : nullptr,
                     .m = m,
                     .n = outputs,
                     .k = k,
                     .y = c.silu ? nullptr : y.data(),
                     .silu_mul = c.silu,
                     .out16 = c.silu ? out16.data() : nullptr};
  if (c.norm) {
    p.norm = {.x = x.data(),
              .residual_in = c.residual ? res.data() : nullptr,
              .residual_out = res_out.data(),
              .weight = gamma.data(),
              .eps = 1e-5f};
  }
  cpu.DecodeGemv(p);

  Dev<uint16_t> dw(w), dx16(x16), dout16(m * outputs);
  Dev<float> dx(x), dres(res), dgamma(gamma), dbias(bias), dy(m * outputs), dres_out(m * k);
  DecodeGemvParams q = p;
  q.x16 = c.norm ? nullptr : dx16.get();
  q.w = dw.get();
  q.bias = c.bias ? dbias.get() : nullptr;
  q.y = c.silu ? nullptr : dy.get();
  q.out16 = c.silu ? dout16.get() : nullptr;
  if (c.norm) {
    q.norm.x = dx.get();
    q.norm.residual_in = c.residual ? dres.get() : nullptr;
    q.norm.residual_out = dres_out.get();
    q.norm.weight = dgamma.get();
  }
  gpu.DecodeGemv(q);
  gpu.Synchronize();
  if (c.norm) {
    EXPECT_EQ(dres_out.Host(), res_out);
  }
  if (c.silu) {  // a rounding boundary may take the neighbouring 16-bit value
    const double ulp = wt == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
    EXPECT_LE(WorstRatio(Widened(dout16.Host(), wt), Widened(out16, wt), 1e-3, ulp), 1.0);
  } else {
    EXPECT_LE(WorstRatio(dy.Host(), y, 1e-4, 1e-4), 1.0);
  }
}

TEST_F(DecodeGemvTest, DecodeGemvMatchesTheOpsItFuses) {
  const int64_t k = 264, outputs = 301;  // k not a multiple of a warp's 256 values
  ASSERT_GE(gpu_->DecodeGemvRows(k), 8);
  for (const DType wt : {DType::kBF16, DType::kF16}) {
    for (const int64_t m : {1, 3, 8}) {
      for (const Case c : {Case{false, false, false, true}, Case{true, true, false, false},
                           Case{true, false, true, true}, Case{false, false, true, false}}) {
        ExpectMatchesCpu(*gpu_, *cpu_, rng_, wt, m, k, outputs, c);
      }
    }
  }
}

// 8 normalized rows of Llama-3.1-8B's hidden size take 64 KiB of shared memory, past the 48 KiB a
// block gets without opting in (the emulator holds kernels to the same limit).
TEST_F(DecodeGemvTest, DecodeGemvTakesRowsPastTheDefaultSharedMemory) {
  const int64_t k = 4096;
  ASSERT_GE(gpu_->DecodeGemvRows(k), 8);
  ExpectMatchesCpu(*gpu_, *cpu_, rng_, DType::kBF16, 8, k, 12, Case{true, true, true, true});
}

// Through an identity matrix y is the normalized input itself: bit for bit the CUDA RmsNorm's
// out16, so that fusing the norm changes no value the GEMM reads.
TEST_F(DecodeGemvTest, DecodeGemvNormalizesAsRmsNormDoes) {
  const int64_t m = 5, k = 520;
  for (const DType wt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(wt)));
    std::vector<uint16_t> identity(k * k, To16(0.0f, wt));
    for (int64_t i = 0; i < k; ++i) identity[i * k + i] = To16(1.0f, wt);
    const std::vector<float> x = Random(m * k, rng_), res = Random(m * k, rng_),
                             gamma = Random(k, rng_);
    Dev<uint16_t> dw(identity), dnormed(m * k);
    Dev<float> dx(x), dres(res), dres_sum(res), dgamma(gamma), dy(m * k), dres_out(m * k);
    gpu_->DecodeGemv({.norm = {.x = dx.get(),
                               .residual_in = dres.get(),
                               .residual_out = dres_out.get(),
                               .weight = dgamma.get(),
                               .eps = 1e-6f},
                      .w = dw.get(),
                      .w_type = wt,
                      .m = m,
                      .n = k,
                      .k = k,
                      .y = dy.get()});
    gpu_->RmsNorm({.x = dx.get(),
                   .residual = dres_sum.get(),
                   .weight = dgamma.get(),
                   .rows = m,
                   .hidden = k,
                   .eps = 1e-6f,
                   .out16 = dnormed.get(),
                   .out16_type = wt});
    gpu_->Synchronize();
    EXPECT_EQ(dy.Host(), Widened(dnormed.Host(), wt));
    EXPECT_EQ(dres_out.Host(), dres_sum.Host());
  }
}

}  // namespace
}  // namespace kvserve::kernels
