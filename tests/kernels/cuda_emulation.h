// Runs CUDA kernels on the CPU, for tests of device code that cannot run here. Each thread of
// a block is a fiber (ucontext) with its own stack; one fiber runs at a time, switching at
// barriers: __syncthreads, and the warp-wide operations, which exchange values through a
// per-warp buffer (shuffles, and the stand-ins for mma.sync m16n8k16 and movmatrix that
// kernels call under KVSERVE_CUDA_EMULATION). Blocks run one after another, so a kernel's
// static __shared__ variables become function statics and its dynamic shared memory one
// buffer per launch (poisoned with NaN bytes).
//
// What it provides is what the kernels under test use; warp operations need every lane of the
// warp (full masks). Memory is the host's: pass host pointers. mma accumulates in float in
// order k = 0..15, which may round differently from the hardware (tests use tolerances).
//
// Include it before any kernel source, in one translation unit:
//   #include "tests/kernels/cuda_emulation.h"
//   #include "kernels/cuda/paged_attention_mma.cuh"
//   emulation::Launch(grid, 128, smem_bytes, [&] { Kernel<...>(args...); });
#ifndef KVSERVE_TESTS_KERNELS_CUDA_EMULATION_H_
#define KVSERVE_TESTS_KERNELS_CUDA_EMULATION_H_

// The CUDA headers first, with their own meaning of the keywords.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <ucontext.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "glog/logging.h"
#include "kernels/cuda/half_pairs.h"

#define KVSERVE_CUDA_EMULATION 1
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define threadIdx (::kvserve::emulation::thread_idx)
#define blockIdx (::kvserve::emulation::block_idx)
#define blockDim (::kvserve::emulation::block_dim)
#define gridDim (::kvserve::emulation::grid_dim)

namespace kvserve::emulation {

struct Index {
  int x = 0, y = 0, z = 0;
};

inline Index thread_idx, block_idx, block_dim, grid_dim;

// The fibers of the block being run and their barriers.
class Block {
 public:
  static constexpr size_t kStackBytes = 256 * 1024;
  static constexpr int kSlotBytes = 64;  // the largest value one lane puts in an exchange

  static Block& Get() {
    static Block block;
    return block;
  }

  // Runs `body` as every thread of block `b` (threads 0..n-1 along x).
  void Run(int n, const std::function<void()>& body) {
    CHECK_EQ(n % 32, 0) << "the emulation runs whole warps";
    body_ = &body;
    if (static_cast<int>(fibers_.size()) < n) fibers_.resize(n);
    warps_.assign(n / 32, Warp{});
    live_ = n;
    block_arrived_ = 0;
    block_gen_ = 0;
    for (int i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      f.stack.resize(kStackBytes);
      f.done = false;
      CHECK_EQ(getcontext(&f.ctx), 0);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = f.stack.size();
      f.ctx.uc_link = &scheduler_;
      makecontext(&f.ctx, &Block::Entry, 0);
    }
    while (live_ > 0) {
      progress_ = false;
      for (int i = 0; i < n; ++i) {
        if (fibers_[i].done) continue;
        current_ = i;
        thread_idx = {i, 0, 0};
        CHECK_EQ(swapcontext(&scheduler_, &fibers_[i].ctx), 0);
      }
      CHECK(progress_ || live_ == 0) << "deadlock: every live thread waits at a barrier";
    }
  }

  // __syncthreads: threads that exited count as arrived.
  void SyncThreads() {
    const uint64_t gen = block_gen_;
    ++block_arrived_;
    progress_ = true;
    ReleaseBlockIfComplete();
    while (block_gen_ == gen) Yield();
  }

  // Deposits `v` for the warp and waits for every lane; returns the lanes' deposits (valid
  // until this lane's next exchange).
  template <typename T>
  const T* Exchange(const T& v) {
    static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>);
    Warp& w = warps_[current_ / 32];
    const uint64_t gen = w.gen;
    auto& slots = w.slots[gen & 1];
    std::memcpy(slots[current_ % 32].data(), &v, sizeof(T));
    ++w.arrived;
    progress_ = true;
    ReleaseWarpIfComplete(w);
    while (w.gen == gen) Yield();
    // Copied out: the slots are overwritten two exchanges later, `lanes` at this fiber's next.
    T* out = LaneCopy<T>();
    for (int l = 0; l < 32; ++l) std::memcpy(&out[l], slots[l].data(), sizeof(T));
    return out;
  }

  void* DynamicShared() { return dynamic_shared_.data(); }
  void SetDynamicShared(size_t bytes) {
    dynamic_shared_.assign(bytes, std::byte{0xff});  // NaN as float
  }

 private:
  struct Fiber {
    ucontext_t ctx{};
    std::vector<char> stack;
    bool done = false;
    std::array<std::byte, 32 * kSlotBytes> lanes{};  // this fiber's copy of an exchange
  };
  struct Warp {
    uint64_t gen = 0;
    int arrived = 0;
    int exited = 0;
    std::array<std::array<std::array<std::byte, kSlotBytes>, 32>, 2> slots{};
  };

  template <typename T>
  T* LaneCopy() {
    return reinterpret_cast<T*>(fibers_[current_].lanes.data());
  }

  static void Entry() {
    Block& b = Get();
    (*b.body_)();
    b.fibers_[b.current_].done = true;
    --b.live_;
    Warp& w = b.warps_[b.current_ / 32];
    ++w.exited;
    b.progress_ = true;
    b.ReleaseWarpIfComplete(w);
    b.ReleaseBlockIfComplete();
  }  // returns to the scheduler through uc_link

  void ReleaseWarpIfComplete(Warp& w) {
    if (w.arrived > 0 && w.arrived + w.exited == 32) {
      w.arrived = 0;
      ++w.gen;
    }
  }
  void ReleaseBlockIfComplete() {
    if (block_arrived_ > 0 && block_arrived_ == live_) {
      block_arrived_ = 0;
      ++block_gen_;
    }
  }
  void Yield() { CHECK_EQ(swapcontext(&fibers_[current_].ctx, &scheduler_), 0); }

  std::vector<Fiber> fibers_;
  std::vector<Warp> warps_;
  ucontext_t scheduler_{};
  const std::function<void()>* body_ = nullptr;
  int current_ = 0, live_ = 0, block_arrived_ = 0;
  uint64_t block_gen_ = 0;
  bool progress_ = false;
  std::vector<std::byte> dynamic_shared_;
};

// Runs `body` (a call of the kernel with its arguments) as every thread of a grid of
// `threads`-thread blocks, block by block.
inline void Launch(Index grid, int threads, size_t dynamic_shared_bytes,
                   const std::function<void()>& body) {
  Block& b = Block::Get();
  grid_dim = grid;
  block_dim = {threads, 1, 1};
  for (int z = 0; z < grid.z; ++z) {
    for (int y = 0; y < grid.y; ++y) {
      for (int x = 0; x < grid.x; ++x) {
        block_idx = {x, y, z};
        b.SetDynamicShared(dynamic_shared_bytes);
        b.Run(threads, body);
      }
    }
  }
}

template <typename T>
T* DynamicShared() {
  return static_cast<T*>(Block::Get().DynamicShared());
}

inline int Lane() { return thread_idx.x % 32; }

// A 16-bit operand half of a 32-bit register as float.
template <bool BF16>
float Half(uint32_t reg, int half) {
  const auto bits = static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16);
  if constexpr (BF16) return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c += a · b with PTX's fragment layouts
// (kernels/cuda/mma_layout.h states them).
template <bool BF16>
void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  const Operands* all = Block::Get().Exchange(Operands{{a[0], a[1], a[2], a[3]}, {b0, b1}});
  const int g = Lane() / 4, t = Lane() % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    float sum = c[e];
    for (int k = 0; k < 16; ++k) {
      const int tk = (k % 8) / 2, hi = k / 8, half = k % 2;
      const float x = Half<BF16>(all[4 * (row % 8) + tk].a[(row / 8) | (hi << 1)], half);
      const float y = Half<BF16>(all[4 * col + tk].b[hi], half);
      sum += x * y;
    }
    c[e] = sum;
  }
}

// movmatrix.sync.aligned.m8n8.trans.b16: lane (g, t) holds row g, columns 2t, 2t + 1 and gets
// row g of the transpose.
inline uint32_t MovMatrixTrans(uint32_t x) {
  const uint32_t* all = Block::Get().Exchange(x);
  const int g = Lane() / 4, t = Lane() % 4;
  const auto element = [&](int r, int c) {
    return (all[4 * r + c / 2] >> (16 * (c % 2))) & 0xffffu;
  };
  return element(2 * t, g) | (element(2 * t + 1, g) << 16);
}

}  // namespace kvserve::emulation

// Device functions the kernels call, on the host.
inline void __syncthreads() { ::kvserve::emulation::Block::Get().SyncThreads(); }

template <typename T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  const T* all = ::kvserve::emulation::Block::Get().Exchange(v);
  return all[::kvserve::emulation::Lane() ^ lane_mask];
}

template <typename T>
T __ldg(const T* p) {
  return *p;
}

inline float __expf(float x) { return std::exp(x); }
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

#endif  // KVSERVE_TESTS_KERNELS_CUDA_EMULATION_H_
