// The tensor-core attention kernel's code-to-fp16 tricks (kernels/cuda/device/half_pairs.h) on
// every code: the pairs' bit patterns, decoded as IEEE fp16 and put through the fp16x2 operation
// the kernel applies (exact here, as on the GPU), must give each code's value in its place.
#include "kernels/cuda/device/half_pairs.h"

#include <cstdint>
#include <random>

#include "common/model/dtype.h"
#include "gtest/gtest.h"

namespace kvserve::kernels::cuda::half_pairs {
namespace {

float Low(uint32_t w) { return F16ToFloat(static_cast<uint16_t>(w & 0xffffu)); }
float High(uint32_t w) { return F16ToFloat(static_cast<uint16_t>(w >> 16)); }

TEST(HalfPairsTest, BytePermFollowsPtx) {
  EXPECT_EQ(BytePerm(0x33221100u, 0x77665544u, 0x7654u), 0x77665544u);
  EXPECT_EQ(BytePerm(0x33221100u, 0x77665544u, 0x3210u), 0x33221100u);
  EXPECT_EQ(BytePerm(0x33221100u, 0x77665544u, 0x0415u), 0x00441155u);
  EXPECT_EQ(BytePerm(0x33221100u, 0x77665544u, 0x5410u), 0x55441100u);
}

TEST(HalfPairsTest, Int8PairsAreTheCodes) {
  std::mt19937 rng(7);
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      // Codes a and b at one pair's places, random bytes at the other pair's.
      const uint32_t noise = rng();
      for (int p = 0; p < 2; ++p) {
        const uint32_t word = p == 0 ? (noise & 0xffff0000u) | a | (b << 8)
                                     : (noise & 0x0000ffffu) | (a << 16) | (b << 24);
        const uint32_t h = Int8PairBiased(word, p);
        ASSERT_EQ(Low(h) - Low(kInt8Offset), static_cast<int8_t>(a)) << a << " " << b << " " << p;
        ASSERT_EQ(High(h) - High(kInt8Offset), static_cast<int8_t>(b)) << a << " " << b << " " << p;
      }
    }
  }
}

TEST(HalfPairsTest, Int4PairsAreTheCodes) {
  std::mt19937 rng(11);
  for (int byte = 0; byte < 256; ++byte) {
    for (int p = 0; p < 4; ++p) {
      for (int trial = 0; trial < 16; ++trial) {
        const uint32_t mask = 0xffu << (8 * p);
        const uint32_t word = (rng() & ~mask) | (static_cast<uint32_t>(byte) << (8 * p));
        const uint32_t h = Int4PairBiased(word, p);
        // fma(h, mul, add) per half; every intermediate is an exact fp16 value.
        EXPECT_EQ(Low(h) * Low(kInt4Mul) + Low(kInt4Add), byte & 0xf) << byte << " " << p;
        EXPECT_EQ(High(h) * High(kInt4Mul) + High(kInt4Add), byte >> 4) << byte << " " << p;
        // The biased values sit in [1024, 2048): fp16's unit there is 1, so they are exact.
        EXPECT_GE(Low(h), 1024.0f);
        EXPECT_LT(High(h), 2048.0f);
      }
    }
  }
}

// The tensor-core kernel's K operand with per-token parameters takes the biased int4 codes
// as they are: with the query's high-nibble channel divided by 16, the pair's dot product minus
// the query's product with kInt4Bias is the product with the codes, and the query's product
// with kInt4Unscale is the sum of its channels (the minimum's factor).
TEST(HalfPairsTest, Int4BiasedCodesFoldIntoTheQuery) {
  const float q_lo = 0.375f, q_hi = -1.25f;  // a pair of query channels (exact in fp16)
  const float q_hi_folded = q_hi / 16.0f;
  for (int byte = 0; byte < 256; ++byte) {
    const uint32_t h = Int4PairBiased(static_cast<uint32_t>(byte), 0);
    const float dot = q_lo * Low(h) + q_hi_folded * High(h);
    const float offset = q_lo * Low(kInt4Bias) + q_hi_folded * High(kInt4Bias);
    EXPECT_EQ(dot - offset, q_lo * (byte & 0xf) + q_hi * (byte >> 4)) << byte;
  }
  EXPECT_EQ(Int4PairBiased(0u, 0), kInt4Bias);
  EXPECT_EQ(q_lo * Low(kInt4Unscale) + q_hi_folded * High(kInt4Unscale), q_lo + q_hi);
}

// The pipelined kernel's V operand: channel pairs of two tokens' words become token pairs.
TEST(HalfPairsTest, TokenPairsAreTheCodes) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 20000; ++trial) {
    const uint32_t a = rng(), b = rng();
    for (int p = 0; p < 4; p += 2) {
      const uint32_t z = InterleaveBytes(a, b, p);
      for (int h = 0; h < 2; ++h) {
        const uint32_t pair = Int8PairBiased(z, h);
        ASSERT_EQ(Low(pair) - Low(kInt8Offset), static_cast<int8_t>(a >> (8 * (p + h))));
        ASSERT_EQ(High(pair) - High(kInt8Offset), static_cast<int8_t>(b >> (8 * (p + h))));
      }
    }
    for (int p = 0; p < 4; ++p) {
      uint32_t lo = 0, hi = 0;
      Int4TokenPairs(a, b, p, lo, hi);
      const auto nibble = [](uint32_t w, int i) {
        return static_cast<float>((w >> (4 * i)) & 0xf);
      };
      ASSERT_EQ(Low(lo) - Low(kInt4Bias), nibble(a, 2 * p));
      ASSERT_EQ(High(lo) - High(kInt4Bias), nibble(b, 2 * p));
      ASSERT_EQ(Low(hi) * Low(kInt4Sixteenth) + Low(kInt4HighAdd), nibble(a, 2 * p + 1));
      ASSERT_EQ(High(hi) * High(kInt4Sixteenth) + High(kInt4HighAdd), nibble(b, 2 * p + 1));
    }
  }
}

TEST(HalfPairsTest, ParameterHalves) {
  const uint32_t a = 0xaaaa1111u, b = 0xbbbb2222u;  // (scale, min) of channels c and c + 1
  EXPECT_EQ(LowHalves(a, b), 0x22221111u);
  EXPECT_EQ(HighHalves(a, b), 0xbbbbaaaau);
  EXPECT_EQ(Broadcast(a, false), 0x11111111u);
  EXPECT_EQ(Broadcast(a, true), 0xaaaaaaaau);
}

}  // namespace
}  // namespace kvserve::kernels::cuda::half_pairs
