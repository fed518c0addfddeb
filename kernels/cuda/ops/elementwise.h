// Launchers of the CUDA backend's row-wise ops (embedding, RMSNorm with fused residual, RoPE,
// SiLU-gated activation, bias add, float32 → fp16/bf16 rounding). Pointers are device
// pointers; every launch is asynchronous on `stream`. Semantics match backend.h's params.
#ifndef KVSERVE_KERNELS_CUDA_OPS_ELEMENTWISE_H_
#define KVSERVE_KERNELS_CUDA_OPS_ELEMENTWISE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvserve::kernels::cuda {

// `table` holds float32 (table_bits 32), bf16 (16, bf16) or fp16 (16, !bf16) rows.
void LaunchEmbedding(const int32_t* ids, const void* table, int table_bits, bool bf16, float* out,
                     int64_t num_tokens, int64_t hidden, cudaStream_t stream);

// The result goes to `out`, or, given `out16`, there as bf16 (`out16_bf16`) or fp16.
void LaunchRmsNorm(const float* x, float* residual, const float* weight, float* out,
                   uint16_t* out16, bool out16_bf16, int64_t rows, int64_t hidden, float eps,
                   int64_t group_rows, int64_t group_stride, cudaStream_t stream);

void LaunchRope(float* x, const int32_t* positions, const float* inv_freq, int64_t num_tokens,
                int64_t num_heads, int64_t head_dim, int64_t row_stride, cudaStream_t stream);

// As LaunchRmsNorm, `out` or `out16`.
void LaunchSiluMul(const float* gate_up, float* out, uint16_t* out16, bool out16_bf16,
                   int64_t num_tokens, int64_t inter, cudaStream_t stream);

// y[r, c] += bias[c] for r < rows, c < cols.
void LaunchAddBias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// out[i] = round-to-nearest-even(x[i]) as fp16 (bf16 when `bf16`), 16-bit patterns.
void LaunchRoundTo16(const float* x, uint16_t* out, int64_t n, bool bf16, cudaStream_t stream);

// dst[rows[i]] = src[from[i]] for i < n (async scheduling's tokens, Backend::GatherTokens).
void LaunchGatherTokens(int32_t* dst, const int32_t* src, const int32_t* rows, const int32_t* from,
                        int64_t n, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_ELEMENTWISE_H_
