// What the CUDA emulator (tests/testing/cuda_emulator/emulator.h) guarantees so that the kernel
// tests fail where a GPU would: the order in which a block's threads run between barriers
// follows KVSERVE_EMULATED_THREAD_ORDER (tests/CMakeLists.txt runs this test in every order),
// so a read of shared memory another thread wrote with no __syncthreads between sees the write
// in some orders and not in others; each block's shared memory, static and dynamic, starts as
// NaN bytes (a GPU's holds garbage), never what the previous block left; a write past the
// launch's dynamic shared memory or past a static shared variable aborts, as do threads waiting
// at different __syncthreads; a misaligned load aborts (UBSan's alignment check, as the tests
// of device code are built), and so does a launch a GPU would refuse.
// clang-format off
#include "tests/testing/cuda_emulator/emulator.h"
// clang-format on
#include <cstdlib>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device/shared_memory.cuh"

namespace kvserve::emulation {
namespace {

constexpr int kThreads = 64;     // two warps
constexpr int kNotWritten = -1;  // shared memory starts as 0xff bytes

// Thread `from` writes 7 to shared memory and thread `to` reads it, with or without a barrier
// between; returns what `to` saw.
int Handoff(int from, int to, bool barrier) {
  int seen = 0;
  Launch({1, 1, 1}, kThreads, sizeof(int), [&] {
    int* x = DynamicShared<int>();
    if (static_cast<int>(threadIdx.x) == from) *x = 7;
    if (barrier) __syncthreads();
    if (static_cast<int>(threadIdx.x) == to) seen = *x;
  });
  return seen;
}

std::string_view Order() {
  const char* order = std::getenv("KVSERVE_EMULATED_THREAD_ORDER");
  return order != nullptr ? order : "forward";
}

TEST(EmulatorTest, AReadAfterABarrierSeesTheWriteInEveryOrder) {
  for (const auto& [from, to] : {std::pair{0, 63}, {63, 0}, {3, 5}, {5, 3}, {40, 2}}) {
    EXPECT_EQ(Handoff(from, to, /*barrier=*/true), 7) << from << " → " << to;
  }
}

TEST(EmulatorTest, AReadWithoutABarrierSeesTheWriteOnlyIfTheWriterRanFirst) {
  const std::string_view order = Order();
  // Whether thread `from` runs before thread `to` up to their first barrier. The read misses
  // the write for 63 → 0 in forward and warps, for 0 → 63 in reverse and warps-reverse: across
  // the orders a missing barrier shows whichever way the data flows.
  auto first = [&](int from, int to) {
    if (order == "reverse") return from > to;
    if (order == "warps-reverse" && from / 32 != to / 32) return from / 32 > to / 32;
    return from < to;  // forward, warps, and lanes of one warp in warps-reverse
  };
  for (const auto& [from, to] : {std::pair{0, 63}, {63, 0}, {3, 5}, {5, 3}, {40, 2}}) {
    EXPECT_EQ(Handoff(from, to, /*barrier=*/false), first(from, to) ? 7 : kNotWritten)
        << order << " order, " << from << " → " << to;
  }
}

// A warp exchange (a shuffle) orders nothing between warps. Warp 1 reads before warp 0 has
// written in the warps-reverse order (warp 1 runs ahead) and in the reverse one (thread 32,
// the last of its warp to reach the exchange, goes on at once).
TEST(EmulatorTest, AWarpExchangeDoesNotOrderOtherWarps) {
  int seen = 0;
  Launch({1, 1, 1}, kThreads, sizeof(int), [&] {
    int* x = DynamicShared<int>();
    if (threadIdx.x == 0) *x = 7;
    __shfl_sync(0xffffffffu, 0, 0);
    if (threadIdx.x == 32) seen = *x;
  });
  const bool first_warp_first = Order() == "forward" || Order() == "warps";
  EXPECT_EQ(seen, first_warp_first ? 7 : kNotWritten);
}

// A block that reads its static shared memory before writing it sees NaN bytes, not what the
// block before it wrote; a thread that reaches the declaration after another of its block
// wrote there does not poison it again.
TEST(EmulatorTest, EachBlockStartsWithPoisonedSharedMemory) {
  std::vector<int> before_write, after_barrier, dynamic_before_write;
  Launch({3, 1, 1}, kThreads, sizeof(int), [&] {
    KVSERVE_SHARED(int[2], x);
    KVSERVE_DYNAMIC_SHARED(int, d);
    if (threadIdx.x == 0) {
      before_write.push_back(x[0]);
      dynamic_before_write.push_back(d[0]);
      x[0] = 100 + blockIdx.x;
      d[0] = 100 + blockIdx.x;
      x[1] = 7;
    }
    __syncthreads();
    if (threadIdx.x == kThreads - 1) after_barrier.push_back(x[1]);
  });
  const std::vector<int> poisoned(3, kNotWritten);
  EXPECT_EQ(before_write, poisoned);
  EXPECT_EQ(dynamic_before_write, poisoned);
  EXPECT_EQ(after_barrier, std::vector<int>(3, 7));
}

TEST(EmulatorDeathTest, WritingPastTheDynamicSharedMemoryAborts) {
  EXPECT_DEATH(Launch({2, 1, 1}, 32, 8,
                      [] {
                        if (blockIdx.x == 1 && threadIdx.x == 0) DynamicShared<int>()[2] = 0;
                      }),
               "dynamic shared memory written past the 8 bytes the launch asked for: byte 0 "
               "after, by block \\(1, 0, 0\\)");
}

TEST(EmulatorDeathTest, WritingPastAStaticSharedVariableAborts) {
  EXPECT_DEATH(Launch({2, 1, 1}, 32, 0,
                      [] {
                        KVSERVE_SHARED(int[4], x);
                        if (blockIdx.x == 1 && threadIdx.x == 0) x[threadIdx.x + 5] = 0;
                      }),
               "static shared memory written past x \\(16 B\\): byte 4 after, by block "
               "\\(1, 0, 0\\)");
}

// Threads of a block that wait at two different __syncthreads (undefined in CUDA: a GPU may
// hang) abort, whichever thread runs first; so do lanes of a warp meeting at two different
// shuffles, and a shuffle after a lane of its warp exited. (The kernels are written outside
// EXPECT_DEATH: within a macro's arguments every call has the macro's source location.)
TEST(EmulatorDeathTest, DivergentBarriersAndShufflesAbort) {
  const auto barriers = [] {
    if (threadIdx.x < 32) {
      __syncthreads();
    } else {
      __syncthreads();
    }
  };
  EXPECT_DEATH(Launch({1, 1, 1}, kThreads, 0, barriers),
               "threads [0-9]+ and [0-9]+ of block \\(0, 0, 0\\) wait at different "
               "__syncthreads: .*emulator_test.cc:[0-9]+ and .*emulator_test.cc:[0-9]+");
  const auto shuffles = [] {
    if (threadIdx.x % 2 == 0) {
      __shfl_xor_sync(0xffffffffu, 1, 1);
    } else {
      __shfl_xor_sync(0xffffffffu, 2, 1);
    }
  };
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 0, shuffles),
               "lanes [0-9]+ and [0-9]+ of warp 0 of block \\(0, 0, 0\\) meet at different warp "
               "exchanges: .*emulator_test.cc:[0-9]+ and .*emulator_test.cc:[0-9]+");
  const auto after_exit = [] {
    if (threadIdx.x == 5) return;
    __shfl_xor_sync(0xffffffffu, 1, 1);
  };
  // Lane 5 exits first (forward order) or while the others wait (the other orders).
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 0, after_exit),
               "(after 1 of its lanes exited|lane 5 of warp 0 exited while other lanes wait)");
  const auto partial_mask = [] { __shfl_xor_sync(0x0000ffffu, 1, 1); };
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 0, partial_mask), "full-warp operations only");
}

// What a GPU refuses to launch (cudaErrorInvalidConfiguration) aborts here too.
TEST(EmulatorDeathTest, LaunchesAGpuWouldRefuseAbort) {
  const auto nothing = [] {};
  EXPECT_DEATH(Launch({0, 1, 1}, 32, 0, nothing), "launch of an empty grid \\(0, 1, 1\\)");
  EXPECT_DEATH(Launch({1, 65536, 1}, 32, 0, nothing), "past 65535 in y or z");
  EXPECT_DEATH(Launch({1, 1, 1}, 2048, 0, nothing), "block of 2048 threads");
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 64 << 10, nothing),
               "dynamic shared memory past the kernel's 49152 B");
  // A kernel's static shared memory counts against the same 48 KiB.
  const auto static_16k = [] {
    KVSERVE_SHARED(float[4096], x);
    x[0] = 0;
  };
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 40 << 10, static_16k),
               "static \\(16384 B\\) and dynamic \\(40960 B\\) shared memory past the block's "
               "49152 B");
  // Opted in (cudaFuncSetAttribute): up to what the kernel asked for, and 227 KiB in all.
  Launch({1, 1, 1}, 32, 64 << 10, nothing, 96 << 10);
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 100 << 10, nothing, 96 << 10),
               "dynamic shared memory past the kernel's 98304 B");
  EXPECT_DEATH(Launch({1, 1, 1}, 32, 220 << 10, static_16k, 227 << 10),
               "static \\(16384 B\\) and dynamic \\(225280 B\\) shared memory past the block's "
               "232448 B");
}

// cp.async: a thread's copies land when it waits for their group, not before; zero-filled past
// their source bytes; other threads see them after that wait and a barrier, in every order.
TEST(EmulatorTest, AsyncCopiesLandWhenTheirThreadWaits) {
  alignas(16) const uint32_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<uint32_t> seen;
  Launch({1, 1, 1}, 32, 48, [&] {
    auto* dst = DynamicShared<uint32_t>();
    if (threadIdx.x == 0) {
      CopyAsync(dst, src, 16, 16);
      CommitCopies();
      CopyAsync(dst + 4, src + 4, 16, 4);  // 4 bytes read, 12 zeros
      CommitCopies();
      CopyAsync(dst + 8, src, 4, 4);
      seen.push_back(dst[0]);  // nothing landed yet
      WaitCopies(1);           // the first group
      seen.push_back(dst[3]);
      seen.push_back(dst[4]);
      WaitCopies(0);  // the second; the third was never committed
      seen.push_back(dst[4]);
      seen.push_back(dst[5]);
      seen.push_back(dst[8]);
    }
    __syncthreads();
    if (threadIdx.x == 31) seen.push_back(dst[1]);
  });
  EXPECT_EQ(seen, (std::vector<uint32_t>{0xffffffffu, 4, 0xffffffffu, 5, 0, 0xffffffffu, 2}));
}

// ldmatrix.x4 as PTX lays it out: lane l gives row l % 8 of matrix l / 8; lane (g, t) gets
// matrix i's row g, columns 2t and 2t + 1, or its transpose's.
TEST(EmulatorTest, LoadMatricesFollowPtx) {
  const auto element = [](int i, int r, int c) {
    return static_cast<uint16_t>(100 * i + 8 * r + c);
  };
  for (const bool trans : {false, true}) {
    std::vector<uint32_t> got(32 * 4);
    Launch({1, 1, 1}, 32, 4 * 8 * 16, [&] {
      auto* m = DynamicShared<uint16_t>();  // 4 matrices of 8 rows of 8, row-major
      const int lane = threadIdx.x;
      for (int c = 0; c < 8; ++c) m[lane * 8 + c] = element(lane / 8, lane % 8, c);
      __syncthreads();
      uint32_t r[4];
      LoadMatrices(m + lane * 8, trans, r);
      for (int i = 0; i < 4; ++i) got[lane * 4 + i] = r[i];
    });
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int i = 0; i < 4; ++i) {
        const uint32_t want = trans ? element(i, 2 * t, g) | element(i, 2 * t + 1, g) << 16
                                    : element(i, g, 2 * t) | element(i, g, 2 * t + 1) << 16;
        EXPECT_EQ(got[lane * 4 + i], want)
            << "lane " << lane << " matrix " << i << " trans " << trans;
      }
    }
  }
}

TEST(EmulatorDeathTest, AMisalignedVectorLoadAborts) {
  alignas(16) unsigned char bytes[48] = {};
  EXPECT_DEATH(
      {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(bytes + 4));
        std::exit(static_cast<int>(v.x));
      },
      "misaligned address");
}

}  // namespace
}  // namespace kvserve::emulation
