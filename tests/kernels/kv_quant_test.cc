// KV cache encodings: FP8 E4M3FN against a table built from the format's definition (OCP:
// bias 7, no infinities, S.1111.111 = NaN, max 448), fp16 against its decoder, and the
// round-trip error bounds of every quantized mode (documented in docs/KV_QUANT.md).
#include "kernels/kv_quant.h"

#include <cmath>
#include <map>
#include <random>

#include "common/model/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kv_ops.h"

namespace kvserve::kernels {
namespace {

// Value of an E4M3FN code from the definition, written independently of dtype.h.
double E4M3Value(int code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, mant = code & 7;
  if (exp == 15 && mant == 7) return NAN;
  const double v =
      exp == 0 ? mant / 8.0 * std::pow(2.0, -6) : (1 + mant / 8.0) * std::pow(2.0, exp - 7);
  return sign ? -v : v;
}

TEST(Fp8E4M3Test, DecoderMatchesTheDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = E4M3Value(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(F8E4M3ToFloat(static_cast<uint8_t>(c)))) << c;
    } else {
      EXPECT_EQ(F8E4M3ToFloat(static_cast<uint8_t>(c)), want) << c;
    }
  }
  EXPECT_EQ(E4M3Value(0x7e), 448.0);
  EXPECT_EQ(E4M3Value(0x01), std::pow(2.0, -9));  // smallest subnormal
  EXPECT_EQ(E4M3Value(0x08), std::pow(2.0, -6));  // smallest normal
}

TEST(Fp8E4M3Test, EncoderRoundsToNearestEvenAndSaturates) {
  // Every finite value encodes to its own code (negative zero to 0x80).
  for (int c = 0; c < 256; ++c) {
    const double v = E4M3Value(c);
    if (std::isnan(v)) continue;
    EXPECT_EQ(FloatToF8E4M3(static_cast<float>(v)), c) << v;
  }
  // Midpoints between neighbours go to the even code; just off the midpoint, to the nearer.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = E4M3Value(c), hi = E4M3Value(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(FloatToF8E4M3(mid), even) << "tie between " << lo << " and " << hi;
    EXPECT_EQ(FloatToF8E4M3(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(FloatToF8E4M3(std::nextafter(mid, 1e9f)), c + 1);
    EXPECT_EQ(FloatToF8E4M3(-mid), 0x80 | even);
  }
  EXPECT_EQ(FloatToF8E4M3(449.0f), 0x7e);  // saturating, never NaN
  EXPECT_EQ(FloatToF8E4M3(1e9f), 0x7e);
  EXPECT_EQ(FloatToF8E4M3(INFINITY), 0x7e);
  EXPECT_EQ(FloatToF8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToF8E4M3(NAN), 0x7f);
  EXPECT_EQ(FloatToF8E4M3(std::pow(2.0f, -10)), 0x00);  // tie with 0 goes to 0 (even)
  EXPECT_EQ(FloatToF8E4M3(1.5f * std::pow(2.0f, -9)), 0x02);
}

TEST(Fp16Test, EncoderInvertsTheDecoderAndRoundsToEven) {
  for (int c = 0; c < 65536; ++c) {
    const float v = F16ToFloat(static_cast<uint16_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(FloatToF16(v), c) << c;
  }
  EXPECT_EQ(FloatToF16(1.0f + std::pow(2.0f, -11)), 0x3c00);      // tie to even (down)
  EXPECT_EQ(FloatToF16(1.0f + 3 * std::pow(2.0f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);                        // rounds to infinity
  EXPECT_EQ(FloatToF16(std::pow(2.0f, -25)), 0x0000);             // tie with zero
  EXPECT_EQ(FloatToBf16(1.0f + std::pow(2.0f, -8)), 0x3f80);      // bf16 tie to even
}

struct Mode {
  KvFormat format;
  const char* name;
};

// Round trip of one 8-token block of head_dim 32: the error of each element against the
// bound for its mode.
TEST(KvQuantTest, RoundTripErrorBounds) {
  const int d = 32, bs = 8;
  std::vector<Mode> modes = {
      {{KvDType::kInt8, KvGranularity::kPerToken, 0}, "int8/per_token"},
      {{KvDType::kInt8, KvGranularity::kPerGroup, 8}, "int8/per_group:8"},
      {{KvDType::kInt8, KvGranularity::kPerChannel, 0}, "int8/per_channel"},
      {{KvDType::kInt4, KvGranularity::kPerToken, 0}, "int4/per_token"},
      {{KvDType::kInt4, KvGranularity::kPerGroup, 8}, "int4/per_group:8"},
      {{KvDType::kInt4, KvGranularity::kPerChannel, 0}, "int4/per_channel"},
      {{KvDType::kFp8E4M3, KvGranularity::kPerToken, 0}, "fp8/per_token"},
      {{KvDType::kFp8E4M3, KvGranularity::kPerChannel, 0}, "fp8/per_channel"},
      {{KvDType::kFp16, KvGranularity::kNone, 0}, "fp16"},
      {{KvDType::kBf16, KvGranularity::kNone, 0}, "bf16"},
  };
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(bs * d);
      for (int t = 0; t < bs; ++t) {
        for (int c = 0; c < d; ++c)
          x[t * d + c] = normal(rng) * (c == 3 ? 20.0f : 1.0f) + (c == 5 ? 4.0f : 0.0f);
      }
      std::vector<uint8_t> data(bs * m.format.RowBytes(d));
      std::vector<uint16_t> scales(std::max<int64_t>(1, m.format.ScaleEntries(bs, d)));
      cpu::BlockHead bh{data.data(), scales.data()};
      for (int t = 0; t < bs; ++t) cpu::WriteRow(m.format, x.data() + t * d, d, bs, bh, t);
      std::vector<float> y(bs * d);
      cpu::ReadRows(m.format, bh, d, bs, y.data());
      // The range each element's parameters cover.
      auto range = [&](int t, int c) -> std::pair<float, float> {
        int t0 = t, t1 = t + 1, c0 = 0, c1 = d;
        if (m.format.granularity == KvGranularity::kPerGroup) {
          c0 = c / m.format.group_size * m.format.group_size;
          c1 = c0 + m.format.group_size;
        } else if (m.format.granularity == KvGranularity::kPerChannel) {
          t0 = 0, t1 = bs, c0 = c, c1 = c + 1;
        }
        float lo = INFINITY, hi = -INFINITY;
        for (int i = t0; i < t1; ++i) {
          for (int j = c0; j < c1; ++j)
            lo = std::min(lo, x[i * d + j]), hi = std::max(hi, x[i * d + j]);
        }
        return {lo, hi};
      };
      for (int t = 0; t < bs; ++t) {
        for (int c = 0; c < d; ++c) {
          const float v = x[t * d + c], err = std::fabs(y[t * d + c] - v);
          auto [lo, hi] = range(t, c);
          const float amax = std::max(std::fabs(lo), std::fabs(hi));
          float bound;
          switch (m.format.dtype) {
            case KvDType::kInt8:
              bound = 0.5f * amax / 127 * 1.002f + 1e-6f;
              break;
            // int4: half a step of (max - min) / 15, plus the fp16 rounding of the minimum.
            case KvDType::kInt4:
              bound = 0.5f * (hi - lo) / 15 * 1.002f + std::fabs(lo) * 1e-3f + 1e-6f;
              break;
            // fp8: 3 mantissa bits, half an ulp relative (2^-4), or the subnormal step.
            case KvDType::kFp8E4M3:
              bound = std::fabs(v) * 0.0625f * 1.002f + amax / 448 * 0.001953125f + 1e-6f;
              break;
            case KvDType::kFp16:
              bound = std::fabs(v) * 4.9e-4f;
              break;
            default:
              bound = std::fabs(v) * 3.91e-3f;
              break;  // bf16: 2^-8
          }
          // Per-channel re-encodes earlier tokens each time a later token widens the block's
          // range: every widening adds at most one half step of the final range.
          if (m.format.granularity == KvGranularity::kPerChannel) {
            float run_lo = x[c], run_hi = x[c];
            for (int i = 1; i <= t; ++i)
              run_lo = std::min(run_lo, x[i * d + c]), run_hi = std::max(run_hi, x[i * d + c]);
            int widenings = 0;
            for (int i = t + 1; i < bs; ++i) {
              const float xi = x[i * d + c];
              const bool wider =
                  m.format.dtype == KvDType::kInt4
                      ? (xi < run_lo || xi > run_hi)
                      : std::fabs(xi) > std::max(std::fabs(run_lo), std::fabs(run_hi));
              widenings += wider;
              run_lo = std::min(run_lo, xi), run_hi = std::max(run_hi, xi);
            }
            bound *= 1 + widenings;
          }
          ASSERT_LE(err, bound) << "t " << t << " c " << c << " x " << v << " got " << y[t * d + c];
        }
      }
    }
  }
}

TEST(KvQuantTest, ScaleBytesAreAccountedExactly) {
  const int d = 128, bs = 16;
  KvFormat int8_group{KvDType::kInt8, KvGranularity::kPerGroup, 128};
  // int8 per-group-128 with fp16 scales: 1 + 2/128 bytes per element, i.e. fp16 × (1/2 + 1/128).
  EXPECT_EQ(int8_group.BlockHeadBytes(bs, d) * 128,
            (KvFormat{KvDType::kFp16}.BlockHeadBytes(bs, d)) * (64 + 1));
  KvFormat int4_channel{KvDType::kInt4, KvGranularity::kPerChannel, 0};
  EXPECT_EQ(int4_channel.BlockHeadBytes(bs, d),
            bs * d / 2 + d * 2 * 2);  // codes + (scale, min) per channel
  KvFormat fp8_token{KvDType::kFp8E4M3, KvGranularity::kPerToken, 0};
  EXPECT_EQ(fp8_token.BlockHeadBytes(bs, d), bs * d + bs * 2);
}

}  // namespace
}  // namespace kvserve::kernels
