// Quantized KV codes to pairs of fp16 values (the operand registers of mma.sync) by integer
// tricks instead of conversions through float, for the tensor-core attention kernel. A code's
// bits are placed in the mantissa of a power of two (1024 = fp16 0x6400, whose mantissa unit
// is 1), then one fp16x2 subtraction or fused multiply-add removes the offset, exactly:
//   int8 (stored signed): the byte ^ 0x80 is code + 128 in [0, 255], so 0x64xx is
//     1024 + code + 128; subtracting 1152 leaves the code.
//   int4 (unsigned, element i in bits 4i..4i+3 of a little-endian word): byte p holds elements
//     2p (low nibble) and 2p + 1 (high nibble); copied into both halves and masked, the low half
//     is 1024 + lo and the high half 1024 + 16·hi; times (1, 1/16) plus (−1024, −64) gives
//     (lo, hi).
// Plain C++ with KVSERVE_HD so that tests/kernels/half_pairs_test.cc checks every code on the
// CPU (prmt emulated by its PTX definition).
#ifndef KVSERVE_KERNELS_CUDA_DEVICE_HALF_PAIRS_H_
#define KVSERVE_KERNELS_CUDA_DEVICE_HALF_PAIRS_H_

#include <cstdint>

#include "kernels/host_device.h"

namespace kvserve::kernels::cuda::half_pairs {

// PTX prmt / CUDA __byte_perm: byte i of the result is byte ((s >> 4i) & 7) of the eight bytes
// y:x (x's bytes are 0..3, y's 4..7).
KVSERVE_HD inline uint32_t BytePerm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t byte = static_cast<uint32_t>(v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu;
    r |= byte << (8 * i);
  }
  return r;
#endif
}

// fp16x2 bit patterns (low half first).
inline constexpr uint32_t kInt8Offset = 0x64806480u;   // (1152, 1152)
inline constexpr uint32_t kInt4Mul = 0x2c003c00u;      // (1, 1/16)
inline constexpr uint32_t kInt4Add = 0xd400e400u;      // (−1024, −64)
inline constexpr uint32_t kInt4Bias = 0x64006400u;     // (1024, 1024): Int4PairBiased of code 0
inline constexpr uint32_t kInt4Unscale = 0x4c003c00u;  // (1, 16)

// Elements 2p and 2p + 1 (p = 0, 1) of a word of four int8 codes, as fp16 (1024 + 128 + code);
// subtract kInt8Offset.
KVSERVE_HD inline uint32_t Int8PairBiased(uint32_t word, int p) {
  return BytePerm(word ^ 0x80808080u, 0x64646464u, p == 0 ? 0x4140u : 0x4342u);
}

// Elements 2p and 2p + 1 (p = 0..3) of a word of eight int4 codes, as fp16 (1024 + lo,
// 1024 + 16·hi); multiply by kInt4Mul and add kInt4Add.
KVSERVE_HD inline uint32_t Int4PairBiased(uint32_t word, int p) {
  const uint32_t both = BytePerm(word, 0u, 0x4040u | (static_cast<uint32_t>(p) * 0x0101u));
  return (both & 0x00f0000fu) | 0x64006400u;
}

// Two tokens' words side by side (the pipelined kernel's V operand pairs tokens, not
// channels): bytes p and p + 1 of `a` and of `b` as (a.p, b.p, a.p+1, b.p+1), so that pair 0 of
// the result holds channel p of both tokens and pair 1 channel p + 1 (Int8PairBiased, or fp8's
// pairwise conversion, then applies). p is 0 or 2.
KVSERVE_HD inline uint32_t InterleaveBytes(uint32_t a, uint32_t b, int p) {
  const auto q = static_cast<uint32_t>(p);
  return BytePerm(a, b, q | (q + 4) << 4 | (q + 1) << 8 | (q + 5) << 12);
}

// The int4 codes of byte p (elements 2p and 2p + 1) of two tokens' words as fp16 pairs:
// lo = (1024 + a's element 2p, 1024 + b's), hi = (1024 + 16·a's element 2p + 1, 1024 + 16·b's);
// subtract kInt4Bias from lo; multiply hi by kInt4Sixteenth and add kInt4HighAdd.
KVSERVE_HD inline void Int4TokenPairs(uint32_t a, uint32_t b, int p, uint32_t& lo, uint32_t& hi) {
  const auto q = static_cast<uint32_t>(p);
  const uint32_t both = BytePerm(a, b, q * 0x11u | (q + 4) * 0x1100u);  // (a.p, a.p, b.p, b.p)
  lo = (both & 0x000f000fu) | 0x64006400u;
  hi = (both & 0x00f000f0u) | 0x64006400u;
}
inline constexpr uint32_t kInt4Sixteenth = 0x2c002c00u;  // (1/16, 1/16)
inline constexpr uint32_t kInt4HighAdd = 0xd400d400u;    // (−64, −64)

// The low (or high) 16 bits of `word` in both halves.
KVSERVE_HD inline uint32_t Broadcast(uint32_t word, bool high) {
  return BytePerm(word, 0u, high ? 0x3232u : 0x1010u);
}

// Two (scale, minimum) words of consecutive channels as (scale, scale') and (min, min').
KVSERVE_HD inline uint32_t LowHalves(uint32_t a, uint32_t b) { return BytePerm(a, b, 0x5410u); }
KVSERVE_HD inline uint32_t HighHalves(uint32_t a, uint32_t b) { return BytePerm(a, b, 0x7632u); }

}  // namespace kvserve::kernels::cuda::half_pairs

#endif  // KVSERVE_KERNELS_CUDA_DEVICE_HALF_PAIRS_H_
