// PTX's documented fragment layouts of mma.sync m16n8k16 and movmatrix.m8n8.trans for one warp,
// in plain C++ on doubles: the reference of the tensor-core attention kernel's fragment mapping
// (tests/kernels/mma_layout_test.cc) and of a GPU's instructions (tests/gpu/mma_probe_test.cc).
#ifndef KVSERVE_TESTS_KERNELS_PTX_FRAGMENTS_H_
#define KVSERVE_TESTS_KERNELS_PTX_FRAGMENTS_H_

#include <array>

namespace kvserve::kernels::cuda::ptx {

using Pair = std::array<double, 2>;                   // a 32-bit register holding two 16-bit values
using Warp4 = std::array<std::array<Pair, 4>, 32>;    // per lane: an A fragment
using Warp2 = std::array<std::array<Pair, 2>, 32>;    // per lane: a B fragment
using WarpC = std::array<std::array<double, 4>, 32>;  // per lane: an accumulator

inline int G(int lane) { return lane / 4; }
inline int T(int lane) { return lane % 4; }

// c += a · b by the PTX layouts of m16n8k16.
inline void Mma(WarpC& c, const Warp4& a, const Warp2& b) {
  double A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = G(lane), t = T(lane);
    for (int r = 0; r < 4; ++r) {
      for (int e = 0; e < 2; ++e) A[g + 8 * (r & 1)][2 * t + 8 * (r >> 1) + e] = a[lane][r][e];
    }
    for (int r = 0; r < 2; ++r) {
      for (int e = 0; e < 2; ++e) B[2 * t + 8 * r + e][g] = b[lane][r][e];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = G(lane), t = T(lane);
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
      for (int k = 0; k < 16; ++k) c[lane][e] += A[row][k] * B[k][col];
    }
  }
}

// movmatrix.m8n8.trans.b16 on one register of every lane.
inline std::array<Pair, 32> Transpose(const std::array<Pair, 32>& x) {
  double M[8][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 2; ++e) M[G(lane)][2 * T(lane) + e] = x[lane][e];
  }
  std::array<Pair, 32> y;
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 2; ++e) y[lane][e] = M[2 * T(lane) + e][G(lane)];
  }
  return y;
}

}  // namespace kvserve::kernels::cuda::ptx

#endif  // KVSERVE_TESTS_KERNELS_PTX_FRAGMENTS_H_
