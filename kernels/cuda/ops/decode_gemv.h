// Launcher of the decode projection (Backend::DecodeGemv's semantics, backend.h; the kernel:
// decode_gemv.cuh). Pointers are device pointers; the launch is asynchronous on `stream`.
#ifndef KVSERVE_KERNELS_CUDA_OPS_DECODE_GEMV_H_
#define KVSERVE_KERNELS_CUDA_OPS_DECODE_GEMV_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvserve::kernels::cuda {

// The most token rows one launch takes.
inline constexpr int64_t kDecodeGemvMaxRows = 8;

// Backend::DecodeGemv's params (backend.h, whose includes nvcc does not compile), the weights'
// type as `bf16` (else fp16); also the kernel's argument (decode_gemv.cuh).
struct DecodeGemvLaunch {
  const uint16_t* x16 = nullptr;
  const float* norm_x = nullptr;
  const float* residual_in = nullptr;
  float* residual_out = nullptr;
  const float* norm_weight = nullptr;  // set: the input is normalized (norm_x)
  float eps = 0;
  const void* w = nullptr;
  bool bf16 = true;
  const float* bias = nullptr;
  float* y = nullptr;
  bool silu_mul = false;
  uint16_t* out16 = nullptr;
  int64_t m = 0, n = 0, k = 0;
};

// Lets the normalizing kernels take up to `max_shared_bytes` of shared memory (the device's
// opt-in limit), once per device before launching; returns the bytes left for the normalized
// rows (m · k · 2 bytes).
int64_t PrepareDecodeGemv(int max_shared_bytes);

// `num_sms`: the device's multiprocessors; the grid is a few blocks per SM at most, fewer with a
// norm, which every block computes for itself.
// p.m <= kDecodeGemvMaxRows, p.k a multiple of 8 (the caller checks).
void LaunchDecodeGemv(const DecodeGemvLaunch& p, int num_sms, cudaStream_t stream);

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_DECODE_GEMV_H_
