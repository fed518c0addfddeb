// Element types that kvserve reads from checkpoints and stores in tensors, with their
// safetensors names and sizes, plus scalar conversions to float32.
//
//   ASSIGN_OR_RETURN(DType t, ParseSafetensorsDType("BF16"));
//   float x = Bf16ToFloat(bits);
#ifndef KVSERVE_COMMON_MODEL_DTYPE_H_
#define KVSERVE_COMMON_MODEL_DTYPE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve {

enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI8, kU8, kI32, kI64 };

// Bytes per element.
size_t DTypeSize(DType t);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...).
std::string_view DTypeName(DType t);
// InvalidArgument naming the string if it is not one of DTypeName's values.
absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name);

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float Bf16ToFloat(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

// IEEE binary16 to float32, exact (subnormals, infinities and NaN included).
inline float F16ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

// OCP FP8 E4M3FN to float32: bias 7, no infinities, S.1111.111 is NaN, max 448.
inline float F8E4M3ToFloat(uint8_t b) {
  uint32_t sign = b & 0x80;
  uint32_t exp = (b >> 3) & 0xf;
  uint32_t mant = b & 0x7;
  float v;
  if (exp == 0xf && mant == 0x7) {
    v = BitsToFloat(0x7fc00000u);
  } else if (exp == 0) {
    v = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
  } else {
    v = BitsToFloat(((exp + 120) << 23) | (mant << 20));
  }
  return sign ? -v : v;
}

inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// float32 to bfloat16, round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// float32 to IEEE binary16, round to nearest even; overflow gives infinity, NaN stays NaN.
inline uint16_t FloatToF16(float f) {
  const uint32_t x = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {                       // below 2^-14: subnormal (exact scaling)
    return sign | static_cast<uint16_t>(std::nearbyint(BitsToFloat(ax) * 16777216.0f));
  }
  uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7fffffu) >> 13);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

// float32 to OCP FP8 E4M3FN: round to nearest even, saturating at ±448 (infinities too), NaN
// to S.1111.111.
inline uint8_t FloatToF8E4M3(float f) {
  const uint8_t sign = (FloatToBits(f) >> 24) & 0x80;
  if (std::isnan(f)) return sign | 0x7f;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (8 reaches the smallest normal)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int q = static_cast<int>(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));
  int exp = e - 1;
  if (q == 8) {
    q = 0;
    ++exp;
  }
  const int code = ((exp + 7) << 3) | q;
  return sign | static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

}  // namespace kvserve

#endif  // KVSERVE_COMMON_MODEL_DTYPE_H_
