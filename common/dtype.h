// Element types that kvserve reads from checkpoints and stores in tensors, with their
// safetensors names and sizes, plus scalar conversions to float32.
//
//   ASSIGN_OR_RETURN(DType t, ParseSafetensorsDType("BF16"));
//   float x = Bf16ToFloat(bits);
#ifndef KVSERVE_COMMON_DTYPE_H_
#define KVSERVE_COMMON_DTYPE_H_

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

}  // namespace kvserve

#endif  // KVSERVE_COMMON_DTYPE_H_
