// The tensor-core attention kernel's fragment mapping (kernels/cuda/device/mma_layout.h) against
// the fragment layouts PTX documents for mma.sync m16n8k16 and movmatrix.m8n8.trans, by emulating
// one warp: the lanes' registers are filled as the kernel fills them, the instructions are
// applied by their documented layouts, and the scores Q·Kᵀ of a 16-token step and the output
// P·V must come out exactly (small integers, so every sum is exact).
#include "kernels/cuda/device/mma_layout.h"

#include <array>
#include <random>

#include "gtest/gtest.h"
#include "tests/kernels/ptx_fragments.h"

namespace kvserve::kernels::cuda::mma {
namespace {

using ptx::G;
using ptx::Mma;
using ptx::Pair;
using ptx::T;
using ptx::Transpose;
using ptx::Warp2;
using ptx::Warp4;
using ptx::WarpC;

class MmaLayoutTest : public ::testing::TestWithParam<int> {};

TEST_P(MmaLayoutTest, ScoresAndOutputsComeOutExact) {
  const int d = GetParam(), chunks = d / 32;
  std::mt19937 rng(d);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<std::vector<double>> q(16, std::vector<double>(d)), k(16, std::vector<double>(d)),
      v(16, std::vector<double>(d)), p(16, std::vector<double>(16));
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < d; ++c) q[r][c] = small(rng), k[r][c] = small(rng), v[r][c] = small(rng);
    for (int tok = 0; tok < 16; ++tok) p[r][tok] = small(rng);
  }
  // What a lane loads: pair i of chunk j of token g of tile u.
  auto loaded = [&](const std::vector<std::vector<double>>& x, int u, int j, int i, int lane) {
    const int c = LoadedChannel(T(lane), j, i);
    return Pair{x[8 * u + G(lane)][c], x[8 * u + G(lane)][c + 1]};
  };
  // Scores of tile u (tokens 8u .. 8u + 7): the kernel's k16 steps (j, h).
  for (int u = 0; u < 2; ++u) {
    WarpC s{};
    for (int j = 0; j < chunks; ++j) {
      for (int h = 0; h < 2; ++h) {
        Warp4 a;
        Warp2 b;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = G(lane), c = QueryChannel(T(lane), j, h);
          for (int rr = 0; rr < 2; ++rr) {
            a[lane][rr] = {q[g + 8 * rr][c], q[g + 8 * rr][c + 1]};
            a[lane][2 + rr] = {q[g + 8 * rr][c + 2], q[g + 8 * rr][c + 3]};
          }
          b[lane] = {loaded(k, u, j, 2 * h, lane), loaded(k, u, j, 2 * h + 1, lane)};
        }
        Mma(s, a, b);
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      for (int e = 0; e < 4; ++e) {
        const int row = G(lane) + 8 * (e >> 1), tok = 8 * u + 2 * T(lane) + (e & 1);
        double want = 0;
        for (int c = 0; c < d; ++c) want += q[row][c] * k[tok][c];
        ASSERT_EQ(s[lane][e], want) << "lane " << lane << " element " << e << " tile " << u;
      }
    }
  }
  // Output: P (as the scores' accumulators of tiles 0 and 1) times V, per n-tile (j, i).
  Warp4 pa;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = G(lane), t = T(lane);
    for (int u = 0; u < 2; ++u) {
      pa[lane][2 * u] = {p[g][8 * u + 2 * t], p[g][8 * u + 2 * t + 1]};
      pa[lane][2 * u + 1] = {p[g + 8][8 * u + 2 * t], p[g + 8][8 * u + 2 * t + 1]};
    }
  }
  for (int j = 0; j < chunks; ++j) {
    for (int i = 0; i < 4; ++i) {
      std::array<Pair, 32> tile0, tile1;
      for (int lane = 0; lane < 32; ++lane) {
        tile0[lane] = loaded(v, 0, j, i, lane);
        tile1[lane] = loaded(v, 1, j, i, lane);
      }
      const std::array<Pair, 32> b0 = Transpose(tile0), b1 = Transpose(tile1);
      Warp2 b;
      for (int lane = 0; lane < 32; ++lane) b[lane] = {b0[lane], b1[lane]};
      WarpC o{};
      Mma(o, pa, b);
      for (int lane = 0; lane < 32; ++lane) {
        for (int e = 0; e < 4; ++e) {
          const int row = G(lane) + 8 * (e >> 1), c = OutputChannel(T(lane), j, i) + (e & 1);
          double want = 0;
          for (int tok = 0; tok < 16; ++tok) want += p[row][tok] * v[tok][c];
          ASSERT_EQ(o[lane][e], want) << "lane " << lane << " chunk " << j << " pair " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, MmaLayoutTest, ::testing::Values(64, 128));

}  // namespace
}  // namespace kvserve::kernels::cuda::mma
