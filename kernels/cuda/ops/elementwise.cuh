// Device code of the CUDA backend's row-wise ops (launchers in elementwise.cu): embedding
// (float32 / fp16 / bf16 tables), RMSNorm with fused residual or over row groups, RoPE,
// SiLU-gated activation, bias add, float32 → fp16 / bf16. The tests also run it on the CPU
// under tests/testing/cuda_emulator/emulator.h.
#ifndef KVSERVE_KERNELS_CUDA_OPS_ELEMENTWISE_CUH_
#define KVSERVE_KERNELS_CUDA_OPS_ELEMENTWISE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/block_reduce.cuh"
#include "kernels/cuda/device/float16.cuh"
#include "kernels/cuda/device/shared_memory.cuh"

namespace kvserve::kernels::cuda::elementwise {

constexpr int kThreads = 256;

template <typename T>
__global__ void EmbeddingKernel(const int32_t* ids, const T* table, float* out, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const T* src = table + static_cast<int64_t>(ids[t]) * hidden;
  float* dst = out + t * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = Widen(src[i]);
}

// Out: float, or the 16-bit type a Gemm takes as x16.
template <typename Out>
__global__ void RmsNormKernel(const float* x, float* residual, const float* weight, Out* out,
                              int64_t hidden, float eps, int64_t group_rows, int64_t group_stride) {
  KVSERVE_SHARED(float[kThreads / 32], scratch);
  const int64_t r = blockIdx.x;
  const int64_t offset =
      group_rows > 0 ? r / group_rows * group_stride + r % group_rows * hidden : r * hidden;
  const float* xr = x + offset;
  float* res = residual == nullptr ? nullptr : residual + offset;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = xr[i];
    if (res != nullptr) {
      v += res[i];
      res[i] = v;
    }
    sum += v * v;
  }
  sum = BlockSum(sum, scratch);
  const float inv = rsqrtf(sum / static_cast<float>(hidden) + eps);
  const float* src = res != nullptr ? res : xr;
  Out* o = out + offset;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    o[i] = Narrow<Out>(weight[i] * (src[i] * inv));
  }
}

// One block per token; threads cover (head, i < head_dim / 2) pairs.
__global__ void RopeKernel(float* x, const int32_t* positions, const float* inv_freq,
                           int64_t num_heads, int64_t head_dim, int64_t row_stride) {
  const int64_t t = blockIdx.x, half = head_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t k = threadIdx.x; k < num_heads * half; k += blockDim.x) {
    const int64_t h = k / half, i = k % half;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    float* row = x + t * row_stride + h * head_dim;
    // Unfused (no FMA contraction), so that the KV write's fused RoPE (kv_write.cu) gives the
    // same bits.
    const float x1 = row[i], x2 = row[i + half];
    row[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    row[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

template <typename Out>
__global__ void SiluMulKernel(const float* gate_up, Out* out, int64_t inter) {
  const int64_t t = blockIdx.x;
  const float* gate = gate_up + t * 2 * inter;
  const float* up = gate + inter;
  for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = gate[i];
    out[t * inter + i] = Narrow<Out>(g / (1.0f + expf(-g)) * up[i]);
  }
}

__global__ void GatherTokensKernel(int32_t* dst, const int32_t* src, const int32_t* rows,
                                   const int32_t* from, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[rows[i]] = src[from[i]];
}

__global__ void AddBiasKernel(float* y, const float* bias, int64_t cols) {
  float* row = y + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] += bias[c];
}

__global__ void RoundTo16Kernel(const float* x, uint16_t* out, int64_t n, bool bf16) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x[i]))
                  : __half_as_ushort(__float2half_rn(x[i]));
  }
}

}  // namespace kvserve::kernels::cuda::elementwise

#endif  // KVSERVE_KERNELS_CUDA_OPS_ELEMENTWISE_CUH_
