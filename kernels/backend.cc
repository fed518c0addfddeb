#include "kernels/backend.h"

#include <vector>

namespace kvserve::kernels {

void Backend::GatherTokens(const GatherTokensParams& p) {
  if (p.n == 0) return;
  std::vector<int32_t> rows(p.n), from(p.n);
  Download(rows.data(), p.rows, sizeof(int32_t) * rows.size());
  Download(from.data(), p.from, sizeof(int32_t) * from.size());
  for (int64_t i = 0; i < p.n; ++i) {
    int32_t token = 0;
    Download(&token, p.src + from[i], sizeof(token));
    Upload(p.dst + rows[i], &token, sizeof(token));
  }
}

void Backend::DecodeGemv(const DecodeGemvParams& p) {
  if (p.m == 0 || p.n == 0) return;
  std::vector<void*> scratch;
  auto take = [&](size_t bytes) {
    scratch.push_back(Allocate(bytes));
    return scratch.back();
  };
  const size_t row_floats = static_cast<size_t>(p.m * p.k);
  const uint16_t* x16 = p.x16;
  if (p.norm.weight != nullptr) {
    auto* rounded = static_cast<uint16_t*>(take(sizeof(uint16_t) * row_floats));
    RmsNormParams norm{.x = p.norm.x,
                       .weight = p.norm.weight,
                       .rows = p.m,
                       .hidden = p.k,
                       .eps = p.norm.eps,
                       .out16 = rounded,
                       .out16_type = p.w_type};
    if (p.norm.residual_in != nullptr) {
      float* r = p.norm.residual_out != nullptr ? p.norm.residual_out
                                                : static_cast<float*>(take(4 * row_floats));
      Copy(r, p.norm.residual_in, sizeof(float) * row_floats);
      norm.residual = r;
    } else if (p.norm.residual_out != nullptr) {
      Copy(p.norm.residual_out, p.norm.x, sizeof(float) * row_floats);
    }
    RmsNorm(norm);
    x16 = rounded;
  }
  GemmParams gemm{.w = p.w,
                  .bias = p.bias,
                  .y = p.y,
                  .m = p.m,
                  .n = p.silu_mul ? 2 * p.n : p.n,
                  .k = p.k,
                  .w_type = p.w_type,
                  .x16 = x16};
  if (p.silu_mul) gemm.y = static_cast<float*>(take(sizeof(float) * 2 * p.m * p.n));
  Gemm(gemm);
  if (p.silu_mul) {
    SiluMul({.gate_up = gemm.y,
             .num_tokens = p.m,
             .inter = p.n,
             .out16 = p.out16,
             .out16_type = p.w_type});
  }
  Synchronize();
  for (void* s : scratch) Free(s);
}

}  // namespace kvserve::kernels
