// Device code of the decode projection (Backend::DecodeGemv; launcher in decode_gemv.cu): a
// matrix-vector product over at most kMaxRows token rows with 16-bit weights, the RMSNorm
// before it and the SiLU·mul after it fused in, so that a decode layer takes four launches for
// its projections and norms instead of seven (backend.h, DecodeGemvParams).
//
// Each warp computes whole outputs: lane l reads 16 bytes (8 weights) of the output's weight
// row at a time, 256 weights a warp-wide load, against the same 8 inputs of every token row,
// then the warp sums its lanes by shuffles. With silu_mul a warp computes gate i and up i
// together (rows i and n + i of [gate; up]), so the activation is applied where both are.
// With a norm, every block first writes the normalized rows to shared memory (m × k 16-bit
// values), in RmsNorm's own order (256 threads striding the row, one BlockSum), so the input is
// bit for bit RmsNorm's out16; block 0 also stores the residual sum. The tests also run it on the
// CPU under tests/testing/cuda_emulator/emulator.h.
#ifndef KVSERVE_KERNELS_CUDA_OPS_DECODE_GEMV_CUH_
#define KVSERVE_KERNELS_CUDA_OPS_DECODE_GEMV_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device/block_reduce.cuh"
#include "kernels/cuda/device/float16.cuh"
#include "kernels/cuda/device/shared_memory.cuh"
#include "kernels/cuda/ops/decode_gemv.h"

namespace kvserve::kernels::cuda::gemv {

constexpr int kThreads = 256;  // elementwise.cuh's: the norm's sums in RmsNorm's order
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = kDecodeGemvMaxRows;
constexpr int kVec = 8;  // 16-bit values per 16-byte load

// acc += Σ_j w[j] · x[j] over the 8 values of each 16-byte word, in float32.
template <typename W>
__device__ __forceinline__ float Dot8(const uint4& wq, const uint4& xq, float acc) {
  const W* wv = reinterpret_cast<const W*>(&wq);
  const W* xv = reinterpret_cast<const W*>(&xq);
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc = fmaf(Widen(wv[j]), Widen(xv[j]), acc);
  return acc;
}

// The normalized rows into `xs`, as RmsNormKernel computes them (one row at a time, the whole
// block on it); block 0 stores r = x + residual_in.
template <typename W>
__device__ void NormalizeRows(const DecodeGemvLaunch& a, W* xs, float* scratch) {
  const int64_t k = a.k;
  const bool store = blockIdx.x == 0 && a.residual_out != nullptr;
  for (int64_t r = 0; r < a.m; ++r) {
    const float* x = a.norm_x + r * k;
    const float* res = a.residual_in == nullptr ? nullptr : a.residual_in + r * k;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      float v = x[i];
      if (res != nullptr) v += res[i];
      if (store) a.residual_out[r * k + i] = v;
      sum += v * v;
    }
    sum = BlockSum(sum, scratch);
    const float inv = rsqrtf(sum / static_cast<float>(k) + a.eps);
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
      const float v = res != nullptr ? x[i] + res[i] : x[i];
      xs[r * k + i] = Narrow<W>(a.norm_weight[i] * (v * inv));
    }
  }
  __syncthreads();
}

// The normalizing kernels' dynamic shared memory: the block sum's floats, then the rows. They
// have no static shared memory, so that their opt-in limit can be the device's whole
// cudaDevAttrMaxSharedMemoryPerBlockOptin (static and dynamic bytes together may not exceed it).
constexpr int kScratchBytes = kWarps * sizeof(float);
static_assert(kScratchBytes % sizeof(uint4) == 0, "the rows start 16-byte aligned");

// Grid: any number of blocks of kThreads; warps stride over the outputs. Dynamic shared memory:
// kScratchBytes + m · k · sizeof(W) with kNorm, none without. W is the weights' type (__half or
// __nv_bfloat16: a.bf16).
template <typename W, bool kNorm, bool kSilu>
__global__ void DecodeGemvKernel(DecodeGemvLaunch a) {
  KVSERVE_DYNAMIC_SHARED(uint4, shared);  // one type for every W: it is one symbol
  const W* x = reinterpret_cast<const W*>(a.x16);
  if constexpr (kNorm) {
    W* xs = reinterpret_cast<W*>(shared + kScratchBytes / sizeof(uint4));
    NormalizeRows<W>(a, xs, reinterpret_cast<float*>(shared));
    x = xs;
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const W* w = static_cast<const W*>(a.w);
  const int64_t m = a.m, k = a.k;
  for (int64_t o = int64_t{blockIdx.x} * kWarps + warp; o < a.n; o += int64_t{gridDim.x} * kWarps) {
    float acc[kMaxRows] = {}, up[kMaxRows] = {};
    const W* w_gate = w + o * k;
    const W* w_up = kSilu ? w + (o + a.n) * k : nullptr;
#pragma unroll 4
    for (int64_t c = int64_t{lane} * kVec; c < k; c += 32 * kVec) {
      const uint4 wq = *reinterpret_cast<const uint4*>(w_gate + c);
      uint4 uq = {};
      if constexpr (kSilu) uq = *reinterpret_cast<const uint4*>(w_up + c);
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        if (r >= m) break;
        const uint4 xq = *reinterpret_cast<const uint4*>(x + r * k + c);
        acc[r] = Dot8<W>(wq, xq, acc[r]);
        if constexpr (kSilu) up[r] = Dot8<W>(uq, xq, up[r]);
      }
    }
    const auto add = [](float p, float q) { return p + q; };
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r >= m) break;
      const float g = WarpReduce(acc[r], add) + (a.bias != nullptr ? a.bias[o] : 0.0f);
      if constexpr (kSilu) {
        const float u = WarpReduce(up[r], add) + (a.bias != nullptr ? a.bias[a.n + o] : 0.0f);
        if (lane == 0) {
          reinterpret_cast<W*>(a.out16)[r * a.n + o] = Narrow<W>(g / (1.0f + expf(-g)) * u);
        }
      } else if (lane == 0) {
        a.y[r * a.n + o] = g;
      }
    }
  }
}

}  // namespace kvserve::kernels::cuda::gemv

#endif  // KVSERVE_KERNELS_CUDA_OPS_DECODE_GEMV_CUH_
