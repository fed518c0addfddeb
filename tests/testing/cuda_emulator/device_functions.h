// The CUDA device functions the kernels call, on the emulator (emulator.h, which includes this
// file at its end; include emulator.h, not this): __syncthreads, the shuffles and votes, the
// stand-ins for mma.sync m16n8k16 and movmatrix, CUB's block reduce and scan, and the
// cooperative-groups calls of the sampling kernels. Each barrier and warp operation knows
// where the kernel called it (std::source_location), so that Block can abort on threads that
// meet at different ones.
#ifndef KVSERVE_TESTS_TESTING_CUDA_EMULATOR_DEVICE_FUNCTIONS_H_
#define KVSERVE_TESTS_TESTING_CUDA_EMULATOR_DEVICE_FUNCTIONS_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <vector>

#include "glog/logging.h"
#include "tests/testing/cuda_emulator/emulator.h"

namespace kvserve::emulation {

// fp16 bits to float, as __half2float gives them (the toolkit's host conversion works bit by
// bit; tensor-core kernels convert millions of operands under emulation).
inline const float* Fp16Table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t b = 0; b < t.size(); ++b) {
      t[b] = __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
    }
    return t;
  }();
  return table.data();
}

// A 16-bit operand half of a 32-bit register as float (`fp16`: Fp16Table()).
template <bool BF16>
float Half(uint32_t reg, int half, const float* fp16) {
  const auto bits = static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16);
  if constexpr (BF16) return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  return fp16[bits];
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c += a · b with PTX's fragment layouts
// (kernels/cuda/device/mma_layout.h states them). Each lane converts the two rows of a and the
// two columns of b its four outputs read, then sums over k in order.
template <bool BF16>
void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
              std::source_location where = std::source_location::current()) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  const std::array<Operands, 32> all =
      Block::Get().Exchange(Operands{{a[0], a[1], a[2], a[3]}, {b0, b1}}, where).All();
  const int g = Lane() / 4, t = Lane() % 4;
  const float* fp16 = BF16 ? nullptr : Fp16Table();
  float x[2][16], y[2][16];  // x[r]: row g + 8r of a; y[j]: column 2t + j of b
  for (int k = 0; k < 16; ++k) {
    const int tk = (k % 8) / 2, hi = k / 8, half = k % 2;
    for (int r = 0; r < 2; ++r) x[r][k] = Half<BF16>(all[4 * g + tk].a[r | (hi << 1)], half, fp16);
    for (int j = 0; j < 2; ++j) y[j][k] = Half<BF16>(all[4 * (2 * t + j) + tk].b[hi], half, fp16);
  }
  for (int e = 0; e < 4; ++e) {
    const float* xr = x[e >> 1];
    const float* yc = y[e & 1];
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum += xr[k] * yc[k];
    c[e] = sum;
  }
}

// movmatrix.sync.aligned.m8n8.trans.b16: lane (g, t) holds row g, columns 2t, 2t + 1 and gets
// row g of the transpose.
inline uint32_t MovMatrixTrans(uint32_t x,
                               std::source_location where = std::source_location::current()) {
  const auto all = Block::Get().Exchange(x, where);
  const int g = Lane() / 4, t = Lane() % 4;
  const auto element = [&](int r, int c) {
    return (all[4 * r + c / 2] >> (16 * (c % 2))) & 0xffffu;
  };
  return element(2 * t, g) | (element(2 * t + 1, g) << 16);
}

// cp.async and its groups (kernels/cuda/device/async_copy.cuh): queued per thread
// (Block::CopyAsync).
inline void CopyAsync(void* dst, const void* src, int bytes, int src_bytes) {
  Block::Get().CopyAsync(dst, src, bytes, src_bytes);
}
inline void CommitCopies() { Block::Get().CommitCopies(); }
inline void WaitCopies(int n) { Block::Get().WaitCopies(n); }

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l gives row l % 8 of matrix l / 8
// (16 bytes of the block's dynamic shared memory, 16-byte aligned); lane (g, t) gets in r[i]
// matrix i's row g, columns 2t and 2t + 1, or with `trans` its transpose's.
inline void LoadMatrices(const void* row, bool trans, uint32_t (&r)[4],
                         std::source_location where = std::source_location::current()) {
  CHECK(reinterpret_cast<uintptr_t>(row) % 16 == 0 && Block::Get().InDynamicShared(row, 16))
      << "ldmatrix row address " << row << " of lane " << Lane()
      << " is not 16 aligned bytes of dynamic shared memory";
  const auto all = Block::Get().Exchange(reinterpret_cast<uintptr_t>(row), where);
  const int g = Lane() / 4, t = Lane() % 4;
  const auto element = [&](int matrix, int rr, int c) {
    uint16_t v;
    std::memcpy(&v, reinterpret_cast<const std::byte*>(all[8 * matrix + rr]) + 2 * c, 2);
    return uint32_t{v};
  };
  for (int i = 0; i < 4; ++i) {
    r[i] = trans ? element(i, 2 * t, g) | element(i, 2 * t + 1, g) << 16
                 : element(i, g, 2 * t) | element(i, g, 2 * t + 1) << 16;
  }
}

}  // namespace kvserve::emulation

// Device functions the kernels call, on the host.
// Each knows where the kernel called it (Block::SyncThreads, Block::Exchange).
inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::kvserve::emulation::Block::Get().SyncThreads(where);
}

namespace kvserve::emulation {
// The warp operations here take every lane of the warp.
inline void CheckFullMask(unsigned mask, const std::source_location& where) {
  CHECK_EQ(mask, 0xffffffffu) << "the emulator runs full-warp operations only ("
                              << where.file_name() << ":" << where.line() << ")";
}
}  // namespace kvserve::emulation

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask,
                  std::source_location where = std::source_location::current()) {
  ::kvserve::emulation::CheckFullMask(mask, where);
  const auto all = ::kvserve::emulation::Block::Get().Exchange(v, where);
  return all[::kvserve::emulation::Lane() ^ lane_mask];
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane,
              std::source_location where = std::source_location::current()) {
  ::kvserve::emulation::CheckFullMask(mask, where);
  const auto all = ::kvserve::emulation::Block::Get().Exchange(v, where);
  return all[src_lane & 31];
}

// vote.any: whether `pred` holds for any lane of the warp.
inline int __any_sync(unsigned mask, int pred,
                      std::source_location where = std::source_location::current()) {
  ::kvserve::emulation::CheckFullMask(mask, where);
  const auto all = ::kvserve::emulation::Block::Get().Exchange(pred != 0 ? 1 : 0, where);
  int any = 0;
  for (int lane = 0; lane < 32; ++lane) any |= all[lane];
  return any;
}

template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T>
T __ldcg(const T* p) {
  return *p;
}
// Blocks run one after another here: every write is visible to the next block.
inline void __threadfence() {}

using std::isnan;
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __uint_as_float(uint32_t x) { return std::bit_cast<float>(x); }
inline uint32_t __float_as_uint(float x) { return std::bit_cast<uint32_t>(x); }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  return ::kvserve::kernels::cuda::half_pairs::BytePerm(x, y, s);
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
// fp16x2 fused multiply-add (not host-callable in cuda_fp16.h): exact here for the kernels'
// operands, else one float rounding before the fp16 one.
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __floats2half2_rn(std::fma(__low2float(a), __low2float(b), __low2float(c)),
                           std::fma(__high2float(a), __high2float(b), __high2float(c)));
}

template <typename T, typename U>
T atomicAdd(T* p, U v) {  // fibers never interleave within a call
  const T old = *p;
  *p = old + static_cast<T>(v);
  return old;
}

// The CUB block collectives the kernels use (the real ones are PTX), by shared memory and
// barriers: the same results, with a fixed order of combination (thread 0 first).
namespace cub {

template <typename T, int N>
class BlockReduce {
 public:
  struct TempStorage {
    T values[N];
  };
  explicit BlockReduce(TempStorage& storage) : s_(storage) {}
  // The aggregate, valid in thread 0.
  template <typename Op>
  T Reduce(T x, Op op) {
    s_.values[threadIdx.x] = x;
    __syncthreads();
    T r = s_.values[0];
    if (threadIdx.x == 0) {
      for (int i = 1; i < N; ++i) r = op(r, s_.values[i]);
    }
    return r;  // no barrier after, as in CUB: reusing the storage needs a __syncthreads
  }
  T Sum(T x) {
    return Reduce(x, [](T a, T b) { return a + b; });
  }

 private:
  TempStorage& s_;
};

template <typename T, int N>
class BlockScan {
 public:
  struct TempStorage {
    T values[N];
  };
  explicit BlockScan(TempStorage& storage) : s_(storage) {}
  void ExclusiveSum(T x, T& out) {
    s_.values[threadIdx.x] = x;
    __syncthreads();
    T sum{};
    for (int i = 0; i < threadIdx.x; ++i) sum = sum + s_.values[i];
    out = sum;  // no barrier after, as in CUB
  }

 private:
  TempStorage& s_;
};

}  // namespace cub

// The cooperative-groups pieces the kernels use, for converged warps (every lane calls).
namespace cooperative_groups {

class coalesced_group {
 public:
  explicit coalesced_group(uint32_t lanes) : lanes_(lanes) {}
  uint32_t lanes() const { return lanes_; }
  unsigned thread_rank() const {
    return std::popcount(lanes_ & ((1u << ::kvserve::emulation::Lane()) - 1u));
  }
  unsigned long long size() const { return std::popcount(lanes_); }
  unsigned long long num_threads() const { return size(); }

 private:
  uint32_t lanes_;
};

inline coalesced_group coalesced_threads() { return coalesced_group(0xffffffffu); }

template <typename Label>
coalesced_group labeled_partition(const coalesced_group& g, Label label,
                                  std::source_location where = std::source_location::current()) {
  const auto all = ::kvserve::emulation::Block::Get().Exchange(label, where);
  uint32_t lanes = 0;
  for (int l = 0; l < 32; ++l) {
    if (((g.lanes() >> l) & 1u) != 0 && all[l] == label) lanes |= 1u << l;
  }
  return coalesced_group(lanes);
}

template <typename T>
struct plus {
  T operator()(T a, T b) const { return a + b; }
};

template <typename T, typename Op>
T reduce(const coalesced_group& g, T value, Op op,
         std::source_location where = std::source_location::current()) {
  const auto all = ::kvserve::emulation::Block::Get().Exchange(value, where);
  bool first = true;
  T r{};
  for (int l = 0; l < 32; ++l) {
    if (((g.lanes() >> l) & 1u) == 0) continue;
    r = first ? all[l] : op(r, all[l]);
    first = false;
  }
  return r;
}

}  // namespace cooperative_groups

#endif  // KVSERVE_TESTS_TESTING_CUDA_EMULATOR_DEVICE_FUNCTIONS_H_
