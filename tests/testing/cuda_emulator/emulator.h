// Runs CUDA kernels on the CPU, for tests of device code that cannot run here. Each thread of
// a block is a fiber (Boost.Context) with its own stack; one fiber runs at a time, switching at
// barriers: __syncthreads, and the warp-wide operations, which exchange values through a
// per-warp buffer (shuffles, and the stand-ins for mma.sync m16n8k16 and movmatrix that
// kernels call under KVSERVE_CUDA_EMULATION). Blocks run one after another, so a kernel's
// static shared variables (KVSERVE_SHARED, kernels/cuda/device/shared_memory.cuh; a bare __shared__
// does not compile here) become function statics, poisoned with NaN bytes when each block
// first reaches them, and its dynamic shared memory one buffer per block, poisoned the same
// way. A read before a block's first write sees NaN, as it would see garbage on a GPU, never
// the previous block's values. Which thread runs first between barriers is set
// by KVSERVE_EMULATED_THREAD_ORDER (Block::ThreadOrder), so that tests can expose missing
// barriers.
//
// What it provides is what the kernels under test use; warp operations need every lane of the
// warp (full masks), live, at the same call, and the threads meeting at a __syncthreads must
// all be at the same one: otherwise the launch aborts, where CUDA leaves it undefined. Memory
// is the host's: pass host pointers. mma accumulates in float in order k = 0..15, which may
// round differently from the hardware (tests use tolerances).
//
// CUB's block reductions and scans and the cooperative-groups calls the sampling kernels make
// are provided the same way (kernels/cuda/ops/sampling.cuh leaves the real headers out under
// KVSERVE_CUDA_EMULATION).
//
// Include it before any kernel source, in one translation unit:
//   #include "tests/testing/cuda_emulator/emulator.h"
//   #include "kernels/cuda/attention/paged_attention_mma.cuh"
//   emulation::Launch(grid, 128, smem_bytes, [&] { Kernel<...>(args...); });
#ifndef KVSERVE_TESTS_TESTING_CUDA_EMULATOR_EMULATOR_H_
#define KVSERVE_TESTS_TESTING_CUDA_EMULATOR_EMULATOR_H_

// The CUDA headers first, with their own meaning of the keywords.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <array>
#include <boost/context/fiber.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "kernels/cuda/device/half_pairs.h"
#include "tests/testing/cuda_emulator/streams.h"

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
#define __shared__ static_assert(false, "declare shared memory with KVSERVE_SHARED");
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
  static constexpr size_t kStackBytes = 64 * 1024;
  static constexpr int kSlotBytes = 64;  // the largest value one lane puts in an exchange
  static constexpr size_t kSharedGuardBytes = 256;  // after each piece of shared memory

  static Block& Get() {
    static Block block;
    return block;
  }

  // Runs `body` as every thread of the current block (threads 0..n-1 along x).
  void Run(int n, const std::function<void()>& body) {
    CHECK_EQ(n % 32, 0) << "the emulation runs whole warps";
    static_guards_.clear();
    static_bytes_ = 0;
    fibers_.clear();
    fibers_.resize(n);
    warps_.assign(n / 32, Warp{});
    live_ = n;
    block_arrived_ = 0;
    block_gen_ = 0;
    copies_.resize(n);
    for (ThreadCopies& c : copies_) {  // copies a block left in flight never land
      c.open.clear();
      c.groups.clear();
    }
    for (int i = 0; i < n; ++i) {
      fibers_[i].self = boost::context::fiber(std::allocator_arg, StackPool{&free_stacks_},
                                              [this, &body](boost::context::fiber&& scheduler) {
                                                fibers_[current_].scheduler = std::move(scheduler);
                                                body();
                                                Exit();
                                                return std::move(fibers_[current_].scheduler);
                                              });
    }
    const Order order = ThreadOrder();
    while (live_ > 0) {
      bool progress = false;
      if (order == Order::kWarps || order == Order::kWarpsReverse) {
        for (int k = 0; k < n / 32; ++k) {
          const int w = order == Order::kWarps ? k : n / 32 - 1 - k;
          do {
            progress_ = false;
            for (int lane = 0; lane < 32; ++lane) Resume(32 * w + lane);
            progress |= progress_;
          } while (progress_);
        }
      } else {
        progress_ = false;
        for (int k = 0; k < n; ++k) Resume(order == Order::kReverse ? n - 1 - k : k);
        progress = progress_;
      }
      CHECK(progress || live_ == 0) << "deadlock: every live thread waits at a barrier";
    }
  }

  // The order in which threads run between barriers (KVSERVE_EMULATED_THREAD_ORDER):
  // - forward (the default): each thread in turn, first to last, up to its next barrier or warp
  //   exchange;
  // - reverse: the same, last to first;
  // - warps: one warp at a time, first to last, each up to its next __syncthreads (through its
  //   exchanges; the warp that completes a barrier goes on to the next one at once);
  // - warps-reverse: the same, last warp first.
  // A thread that reads what another wrote, with no __syncthreads between, sees the write in
  // one order and not in another; and a warp that runs ahead overwrites what a slower one has
  // still to read, or writes before a slower one clears. So the same test run in the four
  // orders catches a missing __syncthreads whichever way the data flows, as racing warps on a
  // GPU would. (A warp exchange is a barrier here; on a GPU it orders no memory: shared
  // memory read across lanes needs __syncwarp, which no kernel uses.)
  // The reverse orders also run a grid's blocks last to first, so that a kernel whose blocks
  // meet through global memory (the pipelined attention's split merge, done by whichever
  // block finishes last) is run with each end of the grid finishing last.
  enum class Order { kForward, kReverse, kWarps, kWarpsReverse };
  static bool BlocksInReverse() {
    return ThreadOrder() == Order::kReverse || ThreadOrder() == Order::kWarpsReverse;
  }
  static Order ThreadOrder() {
    static const Order order = [] {
      const char* v = std::getenv("KVSERVE_EMULATED_THREAD_ORDER");
      const std::string_view name = v != nullptr ? v : "forward";
      if (name == "forward") return Order::kForward;
      if (name == "reverse") return Order::kReverse;
      if (name == "warps") return Order::kWarps;
      CHECK(name == "warps-reverse") << "KVSERVE_EMULATED_THREAD_ORDER must be forward, reverse, "
                                     << "warps or warps-reverse, got '" << name << "'";
      return Order::kWarpsReverse;
    }();
    return order;
  }

  // __syncthreads, called at `where`: threads that exited count as arrived. The threads that
  // meet at a barrier must all wait at the same __syncthreads: in CUDA one in code that not
  // every thread reaches is undefined (it may hang), so a block whose threads wait at two
  // different ones aborts.
  void SyncThreads(std::source_location where) {
    const uint64_t gen = block_gen_;
    if (block_arrived_ == 0) {
      barrier_ = {where, current_};
    } else {
      CHECK(SameSite(where, barrier_.where))
          << "threads " << barrier_.thread << " and " << current_ << " of block (" << block_idx.x
          << ", " << block_idx.y << ", " << block_idx.z
          << ") wait at different __syncthreads: " << Name(barrier_.where) << " and "
          << Name(where);
    }
    ++block_arrived_;
    progress_ = true;
    ReleaseBlockIfComplete();
    while (block_gen_ == gen) Yield();
  }

  using Slots = std::array<std::array<std::byte, kSlotBytes>, 32>;  // a warp's deposits

  // The lanes' deposits of one exchange, read in place. Valid until the reading lane's next
  // exchange: a warp alternates two sets of slots, and no lane can deposit into this set again
  // (two exchanges on) before every lane, this one included, has reached the next.
  template <typename T>
  class Lanes {
   public:
    explicit Lanes(const Slots& slots) : slots_(&slots) {}
    T operator[](int lane) const {
      T v;
      std::memcpy(&v, (*slots_)[lane].data(), sizeof(T));
      return v;
    }
    std::array<T, 32> All() const {
      std::array<T, 32> all;
      for (int l = 0; l < 32; ++l) all[l] = (*this)[l];
      return all;
    }

   private:
    const Slots* slots_;
  };

  // Deposits `v` for the warp and waits for every lane; returns the lanes' deposits (valid
  // until this lane's next exchange). `where` is the call in the kernel: in CUDA every lane of
  // a full-mask shuffle, vote or mma must be live and execute the same one, so a lane that
  // exited before it, or lanes meeting at different ones, abort.
  template <typename T>
  Lanes<T> Exchange(const T& v, std::source_location where) {
    static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>);
    Warp& w = warps_[current_ / 32];
    CHECK_EQ(w.exited, 0) << "warp " << current_ / 32 << " of block (" << block_idx.x << ", "
                          << block_idx.y << ", " << block_idx.z << ") reaches the warp exchange at "
                          << Name(where) << " after " << w.exited << " of its lanes exited";
    if (w.arrived == 0) {
      w.site = {where, current_ % 32};
    } else {
      CHECK(SameSite(where, w.site.where))
          << "lanes " << w.site.thread << " and " << current_ % 32 << " of warp " << current_ / 32
          << " of block (" << block_idx.x << ", " << block_idx.y << ", " << block_idx.z
          << ") meet at different warp exchanges: " << Name(w.site.where) << " and " << Name(where);
    }
    const uint64_t gen = w.gen;
    Slots& slots = w.slots[gen & 1];
    std::memcpy(slots[current_ % 32].data(), &v, sizeof(T));
    progress_ = true;
    if (++w.arrived == 32) {  // the last lane releases the warp (none exits while others wait)
      w.arrived = 0;
      ++w.gen;
    }
    while (w.gen == gen) Yield();
    return Lanes<T>(slots);
  }

  // A static shared variable of `bytes` bytes followed by kSharedGuardBytes of guard, reached
  // by a thread of the running block: NaN bytes, guard included, if it is the block's first.
  // The block's static and dynamic shared memory must fit in the 48 KiB a launch gets.
  void StaticShared(void* p, size_t bytes, const char* name) {
    const auto* guard = static_cast<const std::byte*>(p) + bytes;
    for (const StaticGuard& g : static_guards_) {
      if (g.guard == guard) return;  // poisoned when the block's first thread reached it
    }
    std::memset(p, 0xff, bytes + kSharedGuardBytes);
    static_guards_.push_back({guard, bytes, name});
    static_bytes_ += bytes;
    CHECK_LE(static_bytes_ + dynamic_bytes_, shared_limit_)
        << "static (" << static_bytes_ << " B) and dynamic (" << dynamic_bytes_
        << " B) shared memory past the block's " << shared_limit_ << " B";
  }
  // Aborts if the block wrote past one of its static shared variables.
  void CheckStaticShared() const {
    for (const StaticGuard& g : static_guards_) {
      for (size_t i = 0; i < kSharedGuardBytes; ++i) {
        CHECK(g.guard[i] == std::byte{0xff})
            << "static shared memory written past " << g.name << " (" << g.bytes << " B): byte "
            << i << " after, by block (" << block_idx.x << ", " << block_idx.y << ", "
            << block_idx.z << ")";
      }
    }
  }

  void* DynamicShared() { return dynamic_shared_.data(); }
  // The launch's dynamic shared memory, NaN bytes, and after it kSharedGuardBytes more that a
  // block must leave alone: CheckDynamicShared aborts if it wrote past the launch's size.
  // `limit`: the kernel's dynamic shared memory limit. Static and dynamic together may take
  // 48 KiB, or the device's kMaxOptInSharedBytes once the kernel opted in to more than that.
  void SetDynamicShared(size_t bytes, size_t limit) {
    shared_limit_ = limit > kDefaultSharedBytes ? kMaxOptInSharedBytes : kDefaultSharedBytes;
    dynamic_bytes_ = bytes;
    dynamic_shared_.assign(bytes + kSharedGuardBytes, std::byte{0xff});  // NaN as float
  }
  void CheckDynamicShared() const {
    for (size_t i = dynamic_bytes_; i < dynamic_shared_.size(); ++i) {
      CHECK(dynamic_shared_[i] == std::byte{0xff})
          << "dynamic shared memory written past the " << dynamic_bytes_
          << " bytes the launch asked for: byte " << i - dynamic_bytes_ << " after, by block ("
          << block_idx.x << ", " << block_idx.y << ", " << block_idx.z << ")";
    }
  }

  // cp.async (kernels/cuda/device/async_copy.cuh) by the running thread: `bytes` bytes into the
  // block's dynamic shared memory, the first `src_bytes` from `src`, the rest zeros. Queued
  // until the thread waits for its group (WaitCopies): only then do other threads (after a
  // barrier) or the thread itself see them, never earlier, as the hardware allows.
  void CopyAsync(void* dst, const void* src, int bytes, int src_bytes) {
    const auto* d = static_cast<const std::byte*>(dst);
    CHECK(d >= dynamic_shared_.data() && d + bytes <= dynamic_shared_.data() + dynamic_bytes_)
        << "cp.async of " << bytes << " B outside the launch's " << dynamic_bytes_
        << " B of dynamic shared memory, by thread " << current_;
    CHECK(reinterpret_cast<uintptr_t>(dst) % bytes == 0 &&
          (src_bytes == 0 || reinterpret_cast<uintptr_t>(src) % bytes == 0))
        << "cp.async of " << bytes << " B from " << src << " to " << dst << ": misaligned";
    copies_[current_].open.push_back({dst, src, bytes, src_bytes});
  }
  void CommitCopies() {
    ThreadCopies& c = copies_[current_];
    c.groups.push_back(std::move(c.open));
    c.open.clear();
  }
  // cp.async.wait_group n: the thread's committed groups but the newest n land.
  void WaitCopies(int n) {
    ThreadCopies& c = copies_[current_];
    while (c.groups.size() > static_cast<size_t>(n)) {
      for (const Copy& k : c.groups.front()) {
        std::memcpy(k.dst, k.src, k.src_bytes);
        std::memset(static_cast<std::byte*>(k.dst) + k.src_bytes, 0, k.bytes - k.src_bytes);
      }
      c.groups.pop_front();
    }
  }
  // Whether [p, p + bytes) lies in the block's dynamic shared memory.
  bool InDynamicShared(const void* p, size_t bytes) const {
    const auto* b = static_cast<const std::byte*>(p);
    return b >= dynamic_shared_.data() && b + bytes <= dynamic_shared_.data() + dynamic_bytes_;
  }

 private:
  struct Copy {
    void* dst;
    const void* src;
    int bytes, src_bytes;
  };
  struct ThreadCopies {
    std::vector<Copy> open;                // issued since the last commit
    std::deque<std::vector<Copy>> groups;  // committed, oldest first
  };
  std::vector<ThreadCopies> copies_;  // per thread of the running block
  static constexpr size_t kDefaultSharedBytes = size_t{48} << 10;
  size_t shared_limit_ = kDefaultSharedBytes;

  // Fiber stacks, kept for the next block (each block starts blockDim fibers).
  struct StackPool {
    std::vector<std::unique_ptr<char[]>>* free;
    boost::context::stack_context allocate() {
      std::unique_ptr<char[]> stack;
      if (free->empty()) {
        stack = std::make_unique<char[]>(kStackBytes);
      } else {
        stack = std::move(free->back());
        free->pop_back();
      }
      boost::context::stack_context c;
      c.size = kStackBytes;
      c.sp = stack.release() + kStackBytes;  // stacks grow down from sp
      return c;
    }
    void deallocate(boost::context::stack_context& c) {
      free->emplace_back(static_cast<char*>(c.sp) - c.size);
    }
  };

  struct Fiber {
    boost::context::fiber self;       // the thread, while it is suspended
    boost::context::fiber scheduler;  // the scheduler, while the thread runs
    bool done = false;
  };
  // Where the threads waiting at a barrier or exchange called it, and the first to arrive.
  struct Site {
    std::source_location where;
    int thread = 0;
  };
  static bool SameSite(const std::source_location& a, const std::source_location& b) {
    return a.line() == b.line() && a.column() == b.column() &&
           (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
  }
  static std::string Name(const std::source_location& w) {
    return std::string(w.file_name()) + ":" + std::to_string(w.line());
  }

  struct Warp {
    uint64_t gen = 0;
    int arrived = 0;
    int exited = 0;
    Site site;  // of the exchange the arrived lanes wait at
    std::array<Slots, 2> slots{};
  };

  // Runs thread i up to its next barrier, exchange or exit (or one more check of the barrier it
  // waits at).
  void Resume(int i) {
    if (fibers_[i].done) return;
    current_ = i;
    thread_idx = {i, 0, 0};
    fibers_[i].self = std::move(fibers_[i].self).resume();
  }

  void Exit() {
    fibers_[current_].done = true;
    --live_;
    Warp& w = warps_[current_ / 32];
    CHECK_EQ(w.arrived, 0) << "lane " << current_ % 32 << " of warp " << current_ / 32
                           << " exited while other lanes wait at the warp exchange at "
                           << Name(w.site.where);
    ++w.exited;
    progress_ = true;
    ReleaseBlockIfComplete();
  }

  void ReleaseBlockIfComplete() {
    if (block_arrived_ > 0 && block_arrived_ == live_) {
      block_arrived_ = 0;
      ++block_gen_;
    }
  }
  void Yield() {
    Fiber& f = fibers_[current_];
    f.scheduler = std::move(f.scheduler).resume();
  }

  std::vector<std::unique_ptr<char[]>> free_stacks_;
  std::vector<Fiber> fibers_;
  std::vector<Warp> warps_;
  int current_ = 0, live_ = 0, block_arrived_ = 0;
  uint64_t block_gen_ = 0;
  Site barrier_;  // of the __syncthreads the arrived threads wait at
  bool progress_ = false;
  std::vector<std::byte> dynamic_shared_;
  size_t dynamic_bytes_ = 0;
  struct StaticGuard {
    const std::byte* guard;
    size_t bytes;
    const char* name;
  };
  std::vector<StaticGuard> static_guards_;  // of the variables the running block reached
  size_t static_bytes_ = 0;
};

// Runs `body` (a call of the kernel with its arguments) as every thread of a grid of
// `threads`-thread blocks, block by block: first to last, or last to first in the reverse
// thread orders (Block::BlocksInReverse). `shared_limit`: the dynamic shared memory a block
// may use, 48 KiB unless the kernel opted in to more (up to kMaxOptInSharedBytes).
// Launches from several host threads (tensor-parallel ranks) run one at a time.
inline void Launch(Index grid, int threads, size_t dynamic_shared_bytes,
                   const std::function<void()>& body, size_t shared_limit = size_t{48} << 10) {
  // What a GPU refuses to launch (cudaErrorInvalidConfiguration), refused here too: an empty
  // grid, a grid past its limits, a block past 1024 threads, more dynamic shared memory than
  // the kernel may take (48 KiB without opting in).
  CHECK(grid.x >= 1 && grid.y >= 1 && grid.z >= 1)
      << "launch of an empty grid (" << grid.x << ", " << grid.y << ", " << grid.z << ")";
  CHECK(grid.y <= 65535 && grid.z <= 65535)
      << "grid (" << grid.x << ", " << grid.y << ", " << grid.z << ") past 65535 in y or z";
  CHECK(threads >= 1 && threads <= 1024) << "block of " << threads << " threads";
  CHECK_LE(shared_limit, kMaxOptInSharedBytes);
  CHECK_LE(dynamic_shared_bytes, shared_limit)
      << "dynamic shared memory past the kernel's " << shared_limit << " B";
  ABSL_CONST_INIT static absl::Mutex one_at_a_time(absl::kConstInit);
  absl::MutexLock lock(&one_at_a_time);
  Block& b = Block::Get();
  grid_dim = grid;
  block_dim = {threads, 1, 1};
  const bool reverse = Block::BlocksInReverse();
  for (int zz = 0; zz < grid.z; ++zz) {
    for (int yy = 0; yy < grid.y; ++yy) {
      for (int xx = 0; xx < grid.x; ++xx) {
        block_idx =
            reverse ? Index{grid.x - 1 - xx, grid.y - 1 - yy, grid.z - 1 - zz} : Index{xx, yy, zz};
        b.SetDynamicShared(dynamic_shared_bytes, shared_limit);
        b.Run(threads, body);
        b.CheckDynamicShared();
        b.CheckStaticShared();
      }
    }
  }
}

// What KVSERVE_SHARED declares under the emulator: the variable, and guard bytes after it.
template <typename T>
struct GuardedShared {
  T value;
  std::byte guard[Block::kSharedGuardBytes];
};

template <typename T>
T& StaticShared(GuardedShared<T>& g, const char* name) {
  static_assert(offsetof(GuardedShared<T>, guard) == sizeof(T));
  Block::Get().StaticShared(&g, sizeof(T), name);
  return g.value;
}

template <typename T>
T* DynamicShared() {
  return static_cast<T*>(Block::Get().DynamicShared());
}

inline int Lane() { return thread_idx.x % 32; }

}  // namespace kvserve::emulation

// The CUDA device functions the kernels call (__syncthreads, shuffles, votes, mma, CUB,
// cooperative groups), on this emulator.
#include "tests/testing/cuda_emulator/device_functions.h"

#endif  // KVSERVE_TESTS_TESTING_CUDA_EMULATOR_EMULATOR_H_
