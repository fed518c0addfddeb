// Element encodings and index math of the paged KV cache, shared by every backend's KV write
// and attention (inline, no CUDA headers, usable from host and device code).
//
// Layout of one layer's K (or V) in a pool of num_blocks blocks:
//   data    [num_blocks][num_kv_heads][block_size][RowBytes(head_dim)]   (int4: two per byte,
//           element i in the low nibble of byte i/2 when i is even)
//   scales  fp16, [num_blocks][num_kv_heads][ScaleEntries(block_size, head_dim)], in order:
//           per_token   [block_size][P]
//           per_group   [block_size][head_dim / group_size][P]
//           per_channel [head_dim][P]            (shared by the block's tokens)
// with P = scale_params(): int8/fp8 store {scale}, int4 stores {scale, minimum}.
//
// Codes: int8 q = clamp(round(x / s), -127, 127), x = q·s, s = amax / 127;
//        fp8  q = e4m3(x / s), x = e4m3⁻¹(q)·s, s = amax / 448;
//        int4 q = clamp(round((x − m) / s), 0, 15), x = q·s + m, s = (max − min) / 15, m = min.
// Scales are rounded to fp16 before use, so encoder and decoder agree exactly.
#ifndef KVSERVE_KERNELS_KV_QUANT_H_
#define KVSERVE_KERNELS_KV_QUANT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/kv/kv_format.h"
#include "common/model/dtype.h"

namespace kvserve::kernels {

struct QParams {
  float scale = 0.0f;
  float zero = 0.0f;  // int4 minimum
};

inline float RoundF16(float x) { return F16ToFloat(FloatToF16(x)); }

// Parameters covering [lo, hi] (lo <= hi), rounded to what the fp16 scales can hold.
inline QParams MakeParams(KvDType t, float lo, float hi) {
  QParams p;
  if (t == KvDType::kInt4) {
    p.zero = RoundF16(lo);
    p.scale = RoundF16((hi - p.zero) / 15.0f);
    // Rounding the minimum up may leave hi out of reach by a hair; widen until it fits.
    while (p.scale > 0.0f && p.zero + 15.0f * p.scale < hi) {
      p.scale = F16ToFloat(static_cast<uint16_t>(FloatToF16(p.scale) + 1));
    }
    return p;
  }
  const float amax = std::max(std::fabs(lo), std::fabs(hi));
  p.scale = RoundF16(amax / (t == KvDType::kInt8 ? 127.0f : 448.0f));
  return p;
}

inline uint8_t EncodeCode(KvDType t, float x, const QParams& p) {
  switch (t) {
    case KvDType::kInt8: {
      if (p.scale == 0.0f) return 0;
      const float q = std::nearbyint(x / p.scale);
      return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f)));
    }
    case KvDType::kFp8E4M3:
      return p.scale == 0.0f ? 0 : FloatToF8E4M3(x / p.scale);
    case KvDType::kInt4: {
      if (p.scale == 0.0f) return 0;
      const float q = std::nearbyint((x - p.zero) / p.scale);
      return static_cast<uint8_t>(std::clamp(q, 0.0f, 15.0f));
    }
    default:
      return 0;
  }
}

inline float DecodeCode(KvDType t, uint8_t code, const QParams& p) {
  switch (t) {
    case KvDType::kInt8:
      return static_cast<float>(static_cast<int8_t>(code)) * p.scale;
    case KvDType::kFp8E4M3:
      return F8E4M3ToFloat(code) * p.scale;
    case KvDType::kInt4:
      return static_cast<float>(code) * p.scale + p.zero;
    default:
      return 0.0f;
  }
}

inline void StoreParams(uint16_t* dst, KvDType t, const QParams& p) {
  dst[0] = FloatToF16(p.scale);
  if (t == KvDType::kInt4) dst[1] = FloatToF16(p.zero);
}

inline QParams LoadParams(const uint16_t* src, KvDType t) {
  QParams p;
  p.scale = F16ToFloat(src[0]);
  if (t == KvDType::kInt4) p.zero = F16ToFloat(src[1]);
  return p;
}

// Reads / writes the code of element i of a row (int4 packs two per byte).
inline uint8_t GetCode(const uint8_t* row, KvDType t, int64_t i) {
  if (t == KvDType::kInt4) return (row[i / 2] >> ((i & 1) * 4)) & 0xf;
  return row[i];
}

inline void SetCode(uint8_t* row, KvDType t, int64_t i, uint8_t code) {
  if (t == KvDType::kInt4) {
    const int shift = (i & 1) * 4;
    row[i / 2] = static_cast<uint8_t>((row[i / 2] & ~(0xf << shift)) | ((code & 0xf) << shift));
  } else {
    row[i] = code;
  }
}

// Unquantized element types.
inline void StoreFloat(uint8_t* row, KvDType t, int64_t i, float x) {
  switch (t) {
    case KvDType::kFp32:
      std::memcpy(row + 4 * i, &x, 4);
      break;
    case KvDType::kFp16: {
      uint16_t h = FloatToF16(x);
      std::memcpy(row + 2 * i, &h, 2);
      break;
    }
    case KvDType::kBf16: {
      uint16_t h = FloatToBf16(x);
      std::memcpy(row + 2 * i, &h, 2);
      break;
    }
    default:
      break;
  }
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_KV_QUANT_H_
