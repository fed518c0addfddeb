// Device side of kernels/kv_quant.h: the same codes, scales and index math, written with
// explicitly rounded operations (__fmul_rn, __fdiv_rn, ...) so that nvcc never contracts them
// into FMAs and the codes the GPU writes are bit-identical to the CPU reference's.
#ifndef KVSERVE_KERNELS_CUDA_OPS_KV_CODEC_CUH_
#define KVSERVE_KERNELS_CUDA_OPS_KV_CODEC_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/kv/kv_types.h"
#include "kernels/cuda/ops/kv_layout.h"

namespace kvserve::kernels::cuda {

struct DevQParams {
  float scale = 0.0f;
  float zero = 0.0f;
};

__device__ inline float DevRoundF16(float x) { return __half2float(__float2half_rn(x)); }

__device__ inline uint16_t DevF16Bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

__device__ inline float DevF16Value(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }

// kv_quant.h's MakeParams.
__device__ inline DevQParams DevMakeParams(KvDType t, float lo, float hi) {
  DevQParams p;
  if (t == KvDType::kInt4) {
    p.zero = DevRoundF16(lo);
    p.scale = DevRoundF16(__fdiv_rn(__fsub_rn(hi, p.zero), 15.0f));
    while (p.scale > 0.0f && __fadd_rn(p.zero, __fmul_rn(15.0f, p.scale)) < hi) {
      p.scale = DevF16Value(static_cast<uint16_t>(DevF16Bits(p.scale) + 1));
    }
    return p;
  }
  const float amax = fmaxf(fabsf(lo), fabsf(hi));
  p.scale = DevRoundF16(__fdiv_rn(amax, t == KvDType::kInt8 ? 127.0f : 448.0f));
  return p;
}

__device__ inline float DevF8ToFloat(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
  return __half2float(__half(h));
}

__device__ inline uint8_t DevEncode(KvDType t, float x, const DevQParams& p) {
  if (p.scale == 0.0f) return 0;
  switch (t) {
    case KvDType::kInt8: {
      const float q = rintf(__fdiv_rn(x, p.scale));
      return static_cast<uint8_t>(static_cast<int8_t>(fminf(fmaxf(q, -127.0f), 127.0f)));
    }
    case KvDType::kFp8E4M3:
      return __nv_cvt_float_to_fp8(__fdiv_rn(x, p.scale), __NV_SATFINITE, __NV_E4M3);
    case KvDType::kInt4: {
      const float q = rintf(__fdiv_rn(__fsub_rn(x, p.zero), p.scale));
      return static_cast<uint8_t>(fminf(fmaxf(q, 0.0f), 15.0f));
    }
    default:
      return 0;
  }
}

// Exact decode (as the CPU's DecodeCode): used where a code is re-encoded.
__device__ inline float DevDecode(KvDType t, uint8_t code, const DevQParams& p) {
  switch (t) {
    case KvDType::kInt8:
      return __fmul_rn(static_cast<float>(static_cast<int8_t>(code)), p.scale);
    case KvDType::kFp8E4M3:
      return __fmul_rn(DevF8ToFloat(code), p.scale);
    case KvDType::kInt4:
      return __fadd_rn(__fmul_rn(static_cast<float>(code), p.scale), p.zero);
    default:
      return 0.0f;
  }
}

__device__ inline void DevStoreParams(uint16_t* dst, KvDType t, const DevQParams& p) {
  dst[0] = DevF16Bits(p.scale);
  if (t == KvDType::kInt4) dst[1] = DevF16Bits(p.zero);
}

__device__ inline DevQParams DevLoadParams(const uint16_t* src, KvDType t) {
  DevQParams p;
  p.scale = DevF16Value(src[0]);
  if (t == KvDType::kInt4) p.zero = DevF16Value(src[1]);
  return p;
}

}  // namespace kvserve::kernels::cuda

#endif  // KVSERVE_KERNELS_CUDA_OPS_KV_CODEC_CUH_
