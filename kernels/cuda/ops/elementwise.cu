// Launchers of the CUDA backend's row-wise ops (the kernels: elementwise.cuh).
#include <algorithm>

#include "kernels/cuda/device/cuda_check.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/ops/elementwise.cuh"
#include "kernels/cuda/ops/elementwise.h"

namespace kvserve::kernels::cuda {

using namespace elementwise;  // NOLINT: the kernels

void LaunchEmbedding(const int32_t* ids, const void* table, int table_bits, bool bf16, float* out,
                     int64_t num_tokens, int64_t hidden, cudaStream_t stream) {
  if (num_tokens == 0) return;
  if (table_bits == 32) {
    LaunchKernel(EmbeddingKernel<float>, num_tokens, kThreads, 0, stream, ids,
                 static_cast<const float*>(table), out, hidden);
  } else if (bf16) {
    LaunchKernel(EmbeddingKernel<__nv_bfloat16>, num_tokens, kThreads, 0, stream, ids,
                 static_cast<const __nv_bfloat16*>(table), out, hidden);
  } else {
    LaunchKernel(EmbeddingKernel<__half>, num_tokens, kThreads, 0, stream, ids,
                 static_cast<const __half*>(table), out, hidden);
  }
}

void LaunchRmsNorm(const float* x, float* residual, const float* weight, float* out,
                   uint16_t* out16, bool out16_bf16, int64_t rows, int64_t hidden, float eps,
                   int64_t group_rows, int64_t group_stride, cudaStream_t stream) {
  if (rows == 0) return;
  if (out16 == nullptr) {
    LaunchKernel(RmsNormKernel<float>, rows, kThreads, 0, stream, x, residual, weight, out, hidden,
                 eps, group_rows, group_stride);
  } else if (out16_bf16) {
    LaunchKernel(RmsNormKernel<__nv_bfloat16>, rows, kThreads, 0, stream, x, residual, weight,
                 reinterpret_cast<__nv_bfloat16*>(out16), hidden, eps, group_rows, group_stride);
  } else {
    LaunchKernel(RmsNormKernel<__half>, rows, kThreads, 0, stream, x, residual, weight,
                 reinterpret_cast<__half*>(out16), hidden, eps, group_rows, group_stride);
  }
}

void LaunchRope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                int64_t num_heads, int64_t head_dim, int64_t row_stride, cudaStream_t stream) {
  if (num_tokens == 0) return;
  LaunchKernel(RopeKernel, num_tokens, kThreads, 0, stream, x, positions, inv_freq, num_heads,
               head_dim, row_stride);
}

void LaunchSiluMul(const float* gate_up, float* out, uint16_t* out16, bool out16_bf16,
                   int64_t num_tokens, int64_t inter, cudaStream_t stream) {
  if (num_tokens == 0) return;
  if (out16 == nullptr) {
    LaunchKernel(SiluMulKernel<float>, num_tokens, kThreads, 0, stream, gate_up, out, inter);
  } else if (out16_bf16) {
    LaunchKernel(SiluMulKernel<__nv_bfloat16>, num_tokens, kThreads, 0, stream, gate_up,
                 reinterpret_cast<__nv_bfloat16*>(out16), inter);
  } else {
    LaunchKernel(SiluMulKernel<__half>, num_tokens, kThreads, 0, stream, gate_up,
                 reinterpret_cast<__half*>(out16), inter);
  }
}

void LaunchAddBias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  LaunchKernel(AddBiasKernel, rows, kThreads, 0, stream, y, bias, cols);
}

void LaunchRoundTo16(const float* x, uint16_t* out, int64_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  LaunchKernel(RoundTo16Kernel, blocks, kThreads, 0, stream, x, out, n, bf16);
}

void LaunchGatherTokens(int32_t* dst, const int32_t* src, const int32_t* rows, const int32_t* from,
                        int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  LaunchKernel(GatherTokensKernel, (n + kThreads - 1) / kThreads, kThreads, 0, stream, dst, src,
               rows, from, n);
}

}  // namespace kvserve::kernels::cuda
